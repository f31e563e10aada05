"""Pure core: the launcher's level-triggered repairs, decided on rows, not events.

- `plan_reconcile(allocations, runs)`: which live allocations (the placer's rows) have
  no run yet and must be started (their `job.allocated` was lost or never handled),
  and which live runs have lost their allocation and must be settled;
- `stale_workers(node, reported, runs)`: which workers a re-registering node still
  runs that are not the live (attempt, generation) of their job on that node, and so
  must be stopped before the node may take work again.

No I/O, no clock: the shell loads the rows and carries out the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from shared.events import RunningWorker
from shared.states import JobState

# Runs whose workers are meant to be on the machines now. COMPLETING is not: its
# workers are being stopped, so one still reported is stale.
_STARTED = frozenset({JobState.STARTING, JobState.RUNNING})


class AllocationRow(msgspec.Struct, frozen=True, kw_only=True):
    """One live allocation as the placer wrote it: nodes in rank order."""

    job_id: int
    attempt: int
    gpus: dict[str, list[int]]
    age_s: float = 0.0  # since the placer wrote it (the database's clock)


class RunRow(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher's `job_runs` row says of a job."""

    job_id: int
    attempt: int
    generation: int  # job_runs.restart_count: the generation the agents were given
    state: JobState
    nodes: tuple[str, ...] = ()


class ReconcilePlan(msgspec.Struct, frozen=True, kw_only=True):
    start: tuple[AllocationRow, ...] = ()  # live allocations without a run
    settle: tuple[int, ...] = ()  # job ids: runs live on an allocation that is gone


def plan_reconcile(
    allocations: Iterable[AllocationRow], runs: Mapping[int, RunRow], lost_after_s: float
) -> ReconcilePlan:
    """Start every live allocation that has no run of its attempt (the same business
    key the event path checks) once it is `lost_after_s` old (a younger one's
    job.allocated is most likely still on its way), settle every started run whose
    allocation is gone.

    A job whose old run is still live under a newer allocation is settled first; its
    new allocation starts on a later pass, once the old run has ended.
    """
    live = {a.job_id: a for a in allocations}
    settle = tuple(
        sorted(
            r.job_id
            for r in runs.values()
            if r.state in _STARTED and (r.job_id not in live or live[r.job_id].attempt != r.attempt)
        )
    )
    start = tuple(
        a
        for job_id, a in sorted(live.items())
        if job_id not in settle
        and a.age_s >= lost_after_s
        and may_start(a.attempt, runs.get(job_id))
    )
    return ReconcilePlan(start=start, settle=settle)


def may_start(alloc_attempt: int, run: RunRow | None) -> bool:
    """The business key of a start, for the event path and the reconcile alike: a job
    with no run yet, or one handed back to the queue before this allocation."""
    if run is None:
        return True
    return run.state == JobState.REQUEUED and run.attempt < alloc_attempt


def stale_workers(
    node: str, reported: Iterable[RunningWorker], runs: Mapping[int, RunRow]
) -> tuple[RunningWorker, ...]:
    """The reported workers that are not their job's live generation on `node`."""
    return tuple(w for w in reported if not _live_here(node, w, runs.get(w.job_id)))


def _live_here(node: str, worker: RunningWorker, run: RunRow | None) -> bool:
    return (
        run is not None
        and run.state in _STARTED
        and (run.attempt, run.generation) == (worker.attempt, worker.generation)
        and node in run.nodes
    )
