"""Pure: which of the selected jobs a cancel, signal, hold, release, approve or requeue
acts on.

The shell loads the selected jobs (locked) as `Target`s; `decide` returns the jobs to
change, the ones left alone with why, or one refusal for the whole request: a command
either does everything it may or, when any selected job is not the actor's to touch,
nothing (as scancel refuses a job of someone else rather than half a list).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import msgspec

from shared.states import ACTIVE, JobState

from .authz import Action, authorize
from .config_model import ClusterConfig

# Workers that are up, or coming up, take a signal; a COMPLETING job's are being stopped.
SIGNALLABLE = frozenset({JobState.STARTING, JobState.RUNNING})
# A requeue stops workers that are up or coming up (Slurm's scontrol requeue of a running
# job); a pending job is already in the queue, a finished one stays finished.
REQUEUEABLE = SIGNALLABLE


class Verb(StrEnum):
    CANCEL = "cancel"
    SIGNAL = "signal"
    HOLD = "hold"
    RELEASE = "release"
    APPROVE = "approve"
    REQUEUE = "requeue"


_AUTHZ = {
    Verb.CANCEL: Action.CANCEL,
    Verb.SIGNAL: Action.SIGNAL,
    Verb.HOLD: Action.HOLD,
    Verb.RELEASE: Action.RELEASE,
    Verb.APPROVE: Action.APPROVE,
    Verb.REQUEUE: Action.REQUEUE,
}


class Target(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    owner: str
    account: str
    state: str  # as `muster queue` shows it
    held: bool = False
    held_by_operator: bool = False
    needs_approval: bool = False
    approved: bool = False
    # selected as one task of an array named whole (`8`, `8_[1-5]`), not by itself: once
    # ended it is left alone without a word, as Slurm's scancel and scontrol leave them
    in_array: bool = False


def in_array(
    refs: Sequence[tuple[int, tuple[int, ...] | None]],
    job_id: int,
    array_job_id: int | None,
    array_task_id: int | None,
) -> bool:
    """Whether a job `refs` selected is an array task selected with others of its array
    (`8` or `8_[1-5]`), not named alone (`8_3`, or the task's own job id)."""
    if array_job_id is None:
        return False
    for ref, tasks in refs:
        if tasks is None and ref == job_id != array_job_id:  # the task's own job id
            return False
        if ref == array_job_id and tasks == (array_task_id,):  # `8_3`
            return False
    return True


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    act_on: tuple[int, ...] = ()
    skipped: tuple[str, ...] = ()
    refusal: str | None = None
    code: str = ""
    # for HOLD (and a requeue that holds): jobs an operator holds for someone else
    operator_hold: tuple[int, ...] = ()


def decide(verb: Verb, actor: str, targets: list[Target], config: ClusterConfig) -> Decision:
    if not targets:
        return Decision(refusal="no job matches the selection", code="not_found")
    for t in targets:
        refused = authorize(_AUTHZ[verb], actor, t.owner, t.account, config)
        if refused is not None:
            return Decision(refusal=f"job {t.job_id}: {refused.message}", code="forbidden")
    act: list[int] = []
    skipped: list[str] = []
    quiet: list[str] = []  # an array's ended tasks, the array named: said only if all are
    for t in targets:
        why = _why_not(verb, actor, t, config)
        if why is None:
            act.append(t.job_id)
        elif why.startswith("!"):
            return Decision(refusal=why[1:], code="forbidden")
        elif t.in_array and t.state not in ACTIVE:
            quiet.append(why)
        else:
            skipped.append(why)
    if not act:
        said = skipped or quiet
        return Decision(refusal="; ".join(said), code="invalid_state", skipped=tuple(said))
    ops = actor in config.operators
    by_op = tuple(t.job_id for t in targets if t.job_id in act and ops and t.owner != actor)
    return Decision(
        act_on=tuple(act),
        skipped=tuple(skipped),
        operator_hold=by_op if verb in (Verb.HOLD, Verb.REQUEUE) else (),
    )


def _why_not(verb: Verb, actor: str, t: Target, config: ClusterConfig) -> str | None:
    """None when `verb` applies to `t`; a reason it is skipped; or '!reason' to refuse."""
    job = f"job {t.job_id}"
    if t.state not in ACTIVE:
        if verb is Verb.REQUEUE:
            return f"{job} already ended ({t.state}); submit it again to run it again"
        return f"{job} already ended ({t.state})"
    match verb:
        case Verb.CANCEL:
            return None
        case Verb.SIGNAL:
            return None if t.state in SIGNALLABLE else f"{job} is {t.state}, not running: no signal"
        case Verb.HOLD:
            if t.state != JobState.PENDING:
                return f"{job} is {t.state}; only pending jobs can be held"
            return None
        case Verb.RELEASE:
            if t.state != JobState.PENDING or not t.held:
                if t.needs_approval and not t.approved:
                    return f"{job} is not held; it waits for an operator's approval"
                return f"{job} is not held"
            if t.held_by_operator and actor not in config.operators:
                return f"!{job} was held by an operator; only an operator may release it"
            return None
        case Verb.REQUEUE:
            if t.state == JobState.PENDING:
                return f"{job} is pending: it is in the queue already"
            if t.state not in REQUEUEABLE:
                return f"{job} is {t.state}; only a running job can be requeued"
            return None
        case Verb.APPROVE:
            if not t.needs_approval:
                return f"{job} needs no approval (its partition does not require it)"
            if t.approved:
                return f"{job} is already approved"
            return None
    return None  # pragma: no cover - every verb is matched
