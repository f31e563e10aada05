"""Table tests of the launcher's level-triggered repairs (services/launcher/reconcile_core.py):
rows in, the whole plan out."""

from __future__ import annotations

import pytest

from services.launcher.reconcile_core import (
    AllocationRow,
    ReconcilePlan,
    RunRow,
    plan_reconcile,
    stale_workers,
)
from shared.events import RunningWorker
from shared.states import JobState

LOST_AFTER_S = 5.0


def alloc(job_id: int, attempt: int = 1, age_s: float = 60.0) -> AllocationRow:
    return AllocationRow(job_id=job_id, attempt=attempt, gpus={"a": [0, 1], "b": [0]}, age_s=age_s)


def run(
    job_id: int, state: JobState, attempt: int = 1, generation: int = 0,
    nodes: tuple[str, ...] = ("a", "b"),
) -> RunRow:  # fmt: skip
    return RunRow(job_id=job_id, attempt=attempt, generation=generation, state=state, nodes=nodes)


def runs(*rows: RunRow) -> dict[int, RunRow]:
    return {r.job_id: r for r in rows}


RECONCILE = {
    "an allocation whose job.allocated never arrived is started": (
        [alloc(1)], runs(), ReconcilePlan(start=(alloc(1),)),
    ),
    "a young allocation is left to its job.allocated, most likely on its way": (
        [alloc(1, age_s=1.0)], runs(), ReconcilePlan(),
    ),
    "a young allocation still keeps its just-started run from being settled": (
        [alloc(1, age_s=0.5)], runs(run(1, JobState.STARTING)), ReconcilePlan(),
    ),
    "an allocation already started (or running) is left alone": (
        [alloc(1), alloc(2)], runs(run(1, JobState.STARTING), run(2, JobState.RUNNING)),
        ReconcilePlan(),
    ),
    "a requeued job's new allocation is started": (
        [alloc(1, attempt=2)], runs(run(1, JobState.REQUEUED, attempt=1)),
        ReconcilePlan(start=(alloc(1, attempt=2),)),
    ),
    "a requeued run whose own allocation is not released yet is not restarted on it": (
        [alloc(1, attempt=1)], runs(run(1, JobState.REQUEUED, attempt=1)), ReconcilePlan(),
    ),
    "a stopping run keeps its allocation and is not started again": (
        [alloc(1)], runs(run(1, JobState.COMPLETING)), ReconcilePlan(),
    ),
    "a job that ended is never started again, whatever allocation remains": (
        [alloc(1, attempt=2)], runs(run(1, JobState.CANCELLED, attempt=0)), ReconcilePlan(),
    ),
    "a running job whose allocation was released is settled": (
        [], runs(run(1, JobState.RUNNING), run(2, JobState.COMPLETED)),
        ReconcilePlan(settle=(1,)),
    ),
    "an old run still live under a newer allocation is settled before anything starts": (
        [alloc(1, attempt=3)], runs(run(1, JobState.RUNNING, attempt=2)),
        ReconcilePlan(settle=(1,)),
    ),
    "a stopping run without an allocation is left to finish its stop": (
        [], runs(run(1, JobState.COMPLETING)), ReconcilePlan(),
    ),
    "starts and settles come in job order": (
        [alloc(3), alloc(1)], runs(run(9, JobState.STARTING), run(4, JobState.RUNNING)),
        ReconcilePlan(start=(alloc(1), alloc(3)), settle=(4, 9)),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("allocs", "rows", "want"), RECONCILE.values(), ids=RECONCILE.keys())
def test_plan_reconcile(
    allocs: list[AllocationRow], rows: dict[int, RunRow], want: ReconcilePlan
) -> None:
    assert plan_reconcile(allocs, rows, LOST_AFTER_S) == want


def worker(job_id: int, attempt: int = 1, generation: int = 0) -> RunningWorker:
    return RunningWorker(job_id=job_id, attempt=attempt, generation=generation)


STALE = {
    "a node that runs nothing has nothing to stop": ([], runs(), ()),
    "the live generation of a running job on this node is kept": (
        [worker(1)], runs(run(1, JobState.RUNNING)), (),
    ),
    "a worker of a job that has ended is stopped": (
        [worker(1)], runs(run(1, JobState.FAILED)), (worker(1),),
    ),
    "a worker of a job the launcher never heard of is stopped": (
        [worker(5)], runs(), (worker(5),),
    ),
    "a worker of an earlier generation is stopped, the job restarted meanwhile": (
        [worker(1, generation=0)], runs(run(1, JobState.RUNNING, generation=1)),
        (worker(1, generation=0),),
    ),
    "a worker of an earlier attempt is stopped, the job requeued and placed again": (
        [worker(1, attempt=1)], runs(run(1, JobState.STARTING, attempt=2)),
        (worker(1, attempt=1),),
    ),
    "a worker on a node the job was moved off is stopped": (
        [worker(1)], runs(run(1, JobState.RUNNING, nodes=("b", "c"))), (worker(1),),
    ),
    "a worker of a run being stopped is stopped": (
        [worker(1)], runs(run(1, JobState.COMPLETING)), (worker(1),),
    ),
    "only the stale ones of several, in the order reported": (
        [worker(3), worker(1), worker(2, generation=4)],
        runs(run(1, JobState.RUNNING), run(2, JobState.RUNNING, generation=4)),
        (worker(3),),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("reported", "rows", "want"), STALE.values(), ids=STALE.keys())
def test_stale_workers(
    reported: list[RunningWorker], rows: dict[int, RunRow], want: tuple[RunningWorker, ...]
) -> None:
    assert stale_workers("a", reported, rows) == want
