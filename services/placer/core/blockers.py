"""Pure core, what holds a pending job back before any resource is looked at.

`--begin` (BEGIN_TIME), `--dependency` (after, afterok, afternotok, afterany, aftercorr,
each with an optional `+MIN` delay for `after`, `?` for "any one is enough", and
singleton) and the
array throttle `--array=...%K` (JOB_ARRAY_TASK_LIMIT). The repo loads `Facts` (the end
state and start of every job depended on, each array's running tasks, the earliest live
job of each user and name); `blockers(jobs, facts, now)` decides. No I/O, no clock.

The detail strings keep Slurm's wording (`Dependency: ...`, `BeginTime: ...`), which
`muster show job` prints and users search for.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum

import msgspec

from services.placer.core.model import Blocker, Waiting
from shared.jobspec import Dependency, JobSpec
from shared.states import JobState


class Ended(msgspec.Struct, frozen=True, kw_only=True):
    """A job depended on: how it ended (None while it has not), and when it started."""

    end: JobState | None = None  # a terminal state (CANCELLED for a cancel before it ran)
    started_at: float | None = None


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    jobs: dict[int, Ended] = {}  # every job (or array task) depended on
    tasks: dict[int, tuple[int, ...]] = {}  # array head -> its task jobs
    task_ids: dict[tuple[int, int], int] = {}  # (array head, task index) -> its job
    first_live: dict[tuple[str, str], int] = {}  # (user, name) -> earliest unfinished job
    array_running: dict[int, int] = {}  # array head -> tasks holding an allocation


class Verdict(StrEnum):
    MET = "MET"
    WAIT = "WAIT"
    NEVER = "NEVER"  # can no longer be met: an afterok job failed, an afternotok one passed


def blockers(jobs: Sequence[tuple[int, JobSpec]], facts: Facts, now: float) -> dict[int, Blocker]:
    """The blocker of each job that has one; a job absent from the result may be placed."""
    out: dict[int, Blocker] = {}
    for job_id, spec in jobs:
        found = begin_time(spec, now) or dependency(job_id, spec, facts, now)
        if found is not None:
            out[job_id] = found
    throttled = [(j, s) for j, s in jobs if s.array_max_running and j not in out]
    out.update(array_limit(throttled, facts.array_running))
    return out


def begin_time(spec: JobSpec, now: float) -> Blocker | None:
    if spec.begin_at is None or spec.begin_at <= now:
        return None
    when = datetime.fromtimestamp(spec.begin_at, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return Blocker(reason=Waiting.BEGIN_TIME, detail=f"BeginTime: not before {when} UTC")


def dependency(job_id: int, spec: JobSpec, facts: Facts, now: float) -> Blocker | None:
    """None when the dependencies hold (all of them, or one under `?`); else why not."""
    if not spec.dependencies:
        return None
    terms = [t for dep in spec.dependencies for t in _terms(job_id, spec, dep, facts, now)]
    verdicts = [v for v, _, _ in terms]
    if (spec.dependency_any and Verdict.MET in verdicts) or all(v is Verdict.MET for v in verdicts):
        return None
    if (Verdict.NEVER in verdicts and not spec.dependency_any) or all(
        v is Verdict.NEVER for v in verdicts
    ):
        never = ", ".join(t for v, t, _ in terms if v is Verdict.NEVER)
        return Blocker(
            reason=Waiting.DEPENDENCY_NEVER_SATISFIED,
            detail=f"DependencyNeverSatisfied: {never} can no longer be met",
        )
    open_terms = [(t, single) for v, t, single in terms if v is not Verdict.MET]
    reason = Waiting.SINGLETON if all(s for _, s in open_terms) else Waiting.DEPENDENCY
    return Blocker(
        reason=reason, detail="Dependency: waiting for " + ", ".join(t for t, _ in open_terms)
    )


def _terms(
    job_id: int, spec: JobSpec, dep: Dependency, facts: Facts, now: float
) -> list[tuple[Verdict, str, bool]]:
    """(verdict, term as the user wrote it, is a singleton) for each job of one term."""
    if dep.kind == "singleton":
        first = facts.first_live.get((spec.user, spec.name), job_id)
        met = Verdict.MET if first >= job_id else Verdict.WAIT
        return [(met, f"singleton (job {first})", True)]
    out = []
    for dep_id in dep.job_ids:
        members = facts.tasks.get(dep_id) or (dep_id,)  # an array: every task of it
        if dep.kind == "aftercorr":
            members = corresponding(dep_id, spec.array_task_id, members, facts)
        known = [facts.jobs[m] for m in members if m in facts.jobs]
        out.append((verdict(dep.kind, dep.delay_s, known, now), f"{dep.kind}:{dep_id}", False))
    return out


def corresponding(
    dep_id: int, task: int | None, members: tuple[int, ...], facts: Facts
) -> tuple[int, ...]:
    """`aftercorr:A`: what task T of an array waits for, A's task T alone; none when A
    has no task T (nothing corresponds, so nothing to wait for). A job that is not an
    array task, or an A that is not an array, waits for the whole of A, as afterok."""
    if task is None or dep_id not in facts.tasks:
        return members
    found = facts.task_ids.get((dep_id, task))
    return () if found is None else (found,)


def verdict(kind: str, delay_s: int, jobs: Sequence[Ended], now: float) -> Verdict:
    """One dependency kind over the jobs it names (an array's tasks: all of them)."""
    ends = [j.end for j in jobs]
    if kind == "after":  # started (at least delay_s ago) or already over
        started = [
            j.end is not None or (j.started_at is not None and j.started_at + delay_s <= now)
            for j in jobs
        ]
        return Verdict.MET if all(started) else Verdict.WAIT
    if kind == "afterany":
        return Verdict.MET if all(e is not None for e in ends) else Verdict.WAIT
    if kind in ("afterok", "aftercorr"):  # aftercorr: of the corresponding task
        if any(e is not None and e is not JobState.COMPLETED for e in ends):
            return Verdict.NEVER
        return Verdict.MET if all(e is JobState.COMPLETED for e in ends) else Verdict.WAIT
    if kind == "afternotok":
        if any(e is None for e in ends):
            return Verdict.WAIT
        return Verdict.MET if any(e is not JobState.COMPLETED for e in ends) else Verdict.NEVER
    return Verdict.MET  # an unknown kind never blocks (admission refuses them)


def array_limit(
    tasks: Sequence[tuple[int, JobSpec]], running: dict[int, int]
) -> dict[int, Blocker]:
    """`--array=...%K`: at most K tasks of an array hold an allocation at once; the
    lowest task ids go first, each one let through counting against the next."""
    room: dict[int | None, int] = {head: n for head, n in running.items()}
    out: dict[int, Blocker] = {}
    for job_id, spec in sorted(tasks, key=lambda t: t[0]):
        head, limit = spec.array_job_id, spec.array_max_running or 0
        now_running = room.get(head, 0)
        if now_running >= limit:
            out[job_id] = Blocker(
                reason=Waiting.JOB_ARRAY_TASK_LIMIT,
                detail=f"JobArrayTaskLimit: {now_running} of at most {limit} tasks running",
            )
        else:
            room[head] = now_running + 1
    return out
