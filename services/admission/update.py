"""Pure: what `muster update` (scontrol update job) may change of the selected jobs.

A job's time limit, nice, name and comment change in place: same id, same place in the
queue (its submit time and age stay). Slurm's rules:

- a pending or a running (allocated, starting) job changes; one ending or ended is
  skipped, saying so;
- its owner, a coordinator of its account or an operator may change it (`Action.MODIFY`);
- only an operator raises a time limit, or sets it over the partition's maximum; anyone
  who may change the job may lower it. A limit is given whole or as a change of each
  job's own (`TimeLimit=+30`, `-30`, `--time=+1:00:00`), which leaves it above 0;
- only an operator gives a negative nice (a higher priority), as at submission.

A running job's limit counts from its run's start, as before: raised, the job runs on
(and the srun steps it runs with it); lowered below what it has run, it ends TIMEOUT at
once. Its coordinator is told (`rearm`: `job.limit_changed`), and the placer plans by
the new limit at its next cycle, as it reads every running job's limit.

None of the fields changes what a pending job was placed or booked by, so a change that
loses a race with the placer (which planned the job before the change and starts it
after) starts the job with the new values: the launcher reads the job's spec when it
starts it, and a start that read the old spec is re-armed by the event.

An array's throttle (`ArrayTaskThrottle=`, its `%K`) changes on each of its tasks,
pending or running; the placer counts it at its next cycle, so a cycle planned by the old
one may start the tasks it allowed. A job that is not an array task is skipped.

Partition, QOS, account, nodes, GPUs per node, required and excluded nodes, features,
begin time and dependency, which the placer plans by, change for a pending job alone (a
started one is skipped, saying to cancel and submit again); the new spec is checked as
a submission is (replan.py).
"""

from __future__ import annotations

import msgspec

from services.admission.actions import Target
from services.admission.apply import UNLIMITED_TIME_S
from services.admission.authz import Action, authorize
from services.admission.config_model import ClusterConfig
from services.admission.replan import PlacementChange
from services.admission.timefmt import format_duration
from shared.states import JobState

MAX_TEXT = 1024  # a name's or comment's characters


class JobChange(msgspec.Struct, frozen=True, kw_only=True):
    """What to change; None: leave as it is."""

    time_limit_s: int | None = None
    time_limit_change_s: int | None = None  # added to each job's own limit (+ or -)
    nice: int | None = None
    name: str | None = None
    comment: str | None = None
    # an array's `%K` (ArrayTaskThrottle=): at most this many of its tasks hold an
    # allocation at once; 0 lifts it. Each of its tasks changes, an array task alone.
    array_throttle: int | None = None
    # what the placer plans the job by (replan.py): a pending job's alone
    placement: PlacementChange | None = None

    def fields(self) -> dict[str, object]:
        """The fields that change, by name (the limit as asked: whole, or its change;
        the placement's fields among them)."""
        fields = {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}
        fields.pop("placement", None)
        return fields | (self.placement.fields() if self.placement else {})

    def replans(self) -> bool:
        return self.placement is not None and bool(self.placement.fields())

    def spec_fields(self) -> dict[str, object]:
        """The spec's fields that change alike on every job (each job's new limit is the
        decision's `limits`; its placement, replan.py's)."""
        alike = {"nice": self.nice, "name": self.name, "comment": self.comment}
        fields: dict[str, object] = {k: v for k, v in alike.items() if v is not None}
        if self.array_throttle is not None:  # 0: none (the spec's None)
            fields["array_max_running"] = self.array_throttle or None
        return fields

    def limit_of(self, current: int) -> int | None:
        """A job's new limit from its `current` one; None: the limit does not change."""
        if self.time_limit_change_s is not None:
            return current + self.time_limit_change_s
        return self.time_limit_s


class UpdateTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A selected job, as its row says."""

    target: Target
    time_limit_s: int
    partition: str
    array_task: bool = False  # one task of an array (its throttle changes with it)


# The states a job is changed in: waiting, or placed and running. One COMPLETING is
# being stopped, its end already decided; a terminal one is history.
PENDING_STATES = frozenset({JobState.PENDING})
STARTED_STATES = frozenset({JobState.CONFIGURING, JobState.STARTING, JobState.RUNNING})
NOT_UPDATABLE = "only a pending or running job can be updated (one ending or ended is done)"
PLACED = (
    "its partition, QOS, account, nodes and GPUs are placed already: cancel the job and"
    " submit it again to change them"
)


class UpdateDecision(msgspec.Struct, frozen=True, kw_only=True):
    act_on: tuple[int, ...] = ()
    # each of `act_on` with its new limit, when the change sets one
    limits: tuple[tuple[int, int], ...] = ()
    # those of `act_on` that have started and whose limit changes: their coordinator
    # re-arms its timers (`job.limit_changed`)
    rearm: tuple[int, ...] = ()
    skipped: tuple[str, ...] = ()
    refusal: str | None = None
    code: str = ""


def check_change(change: JobChange) -> str | None:
    """Why the change itself cannot be made, whatever the job; None when it can."""
    if not change.fields():
        return (
            "say what to change: TimeLimit=, Nice=, JobName=, Comment=, Partition=, QOS=,"
            " Account=, NumNodes=, Gres=, ReqNodeList=, ExcNodeList=, Features=, StartTime=,"
            " Dependency= or ArrayTaskThrottle= (--time, --nice, --name, --comment,"
            " --partition, --qos, --account, --nodes, --gpus-per-node, --nodelist, --exclude,"
            " --constraint, --begin, --dependency, --array-throttle)"
        )
    if change.time_limit_s is not None and change.time_limit_change_s is not None:
        return "give the time limit once: whole (2:00:00) or as a change (+30, -30)"
    if change.time_limit_s is not None and change.time_limit_s <= 0:
        return "a time limit is above 0; write it as MM, HH:MM:SS or D-HH:MM:SS"
    if change.time_limit_change_s == 0:
        return "a change of the time limit is not 0; write it as +MM or -MM (+HH:MM:SS)"
    for what, text in (("name", change.name), ("comment", change.comment)):
        if text is None:
            continue
        if what == "name" and not text.strip():
            return "a job's name is not empty"
        if len(text) > MAX_TEXT or any(c in text for c in "\n\r\0"):
            return f"a job's {what} is one line of at most {MAX_TEXT} characters"
    return None


def decide_update(
    actor: str, targets: list[UpdateTarget], change: JobChange, config: ClusterConfig
) -> UpdateDecision:
    """The jobs to change, those skipped with why, or one refusal for the request."""
    bad = check_change(change)
    if bad is not None:
        return UpdateDecision(refusal=bad, code="invalid")
    if not targets:
        return UpdateDecision(refusal="no job matches the selection", code="not_found")
    for u in targets:
        t = u.target
        refused = authorize(Action.MODIFY, actor, t.owner, t.account, config)
        if refused is not None:
            return UpdateDecision(refusal=f"job {t.job_id}: {refused.message}", code="forbidden")
    act: list[int] = []
    limits: list[tuple[int, int]] = []
    rearm: list[int] = []
    skipped: list[str] = []
    quiet: list[str] = []  # an array's ended tasks, the array named: said only if all are
    for u in targets:
        job = f"job {u.target.job_id}"
        state = u.target.state
        if state not in PENDING_STATES | STARTED_STATES:
            (quiet if u.target.in_array else skipped).append(f"{job} is {state}; {NOT_UPDATABLE}")
            continue
        if change.array_throttle is not None and not u.array_task:
            skipped.append(f"{job} is not an array task: ArrayTaskThrottle= is an array's")
            continue
        if state in STARTED_STATES and change.replans():
            skipped.append(f"{job} is {state}; {PLACED}")
            continue
        limit = change.limit_of(u.time_limit_s)
        if limit is not None and limit <= 0:
            return UpdateDecision(
                refusal=f"{job}: its time limit is {format_duration(u.time_limit_s)}, and"
                f" {format_duration(-(change.time_limit_change_s or 0))} less is none;"
                " give a smaller change or a whole limit",
                code="invalid",
            )
        if limit is not None and limit > UNLIMITED_TIME_S:
            return UpdateDecision(
                refusal=f"{job}: a time limit of {limit} s is past UNLIMITED"
                f" ({UNLIMITED_TIME_S} s); give a smaller one",
                code="invalid",
            )
        refusal = _not_permitted(actor, u, limit, change.nice, config)
        if refusal is not None:
            return UpdateDecision(refusal=f"{job}: {refusal}", code="forbidden")
        act.append(u.target.job_id)
        if limit is not None:
            limits.append((u.target.job_id, limit))
            if state in STARTED_STATES:
                rearm.append(u.target.job_id)
    if not act:
        said = skipped or quiet
        return UpdateDecision(refusal="; ".join(said), code="invalid_state", skipped=tuple(said))
    return UpdateDecision(
        act_on=tuple(act), limits=tuple(limits), rearm=tuple(rearm), skipped=tuple(skipped)
    )


def _not_permitted(
    actor: str, u: UpdateTarget, limit: int | None, niceness: int | None, config: ClusterConfig
) -> str | None:
    if actor in config.operators:
        return None
    if limit is not None and limit > u.time_limit_s:
        return (
            f"only an operator may raise a time limit ({format_duration(u.time_limit_s)} now);"
            f" ask for {format_duration(u.time_limit_s)} or less"
        )
    part = config.partitions.get(u.partition)
    most = None if part is None else part.max_time_s
    if limit is not None and most is not None and limit > most:
        return (
            f"time limit {format_duration(limit)} is over the maximum of partition"
            f" {u.partition!r}: {format_duration(most)}"
        )
    if niceness is not None and niceness < 0:
        return f"--nice={niceness}: only an operator may raise a job's priority; use 0 or more"
    return None
