"""Table tests of the chaos checker's pure rules: each broken invariant is caught, and
what the design allows (a stop within its grace, a node reused after it came back) is
not taken for a violation."""

from __future__ import annotations

import pytest

from tests.chaos.checker import (
    STALE_GRACE_S,
    Invariant,
    LeaseWatch,
    NodeSample,
    Placement,
    Run,
    Violation,
    Watch,
    excluded_placements,
    gpu_conflicts,
    outside_allocation,
    tally,
)
from tests.chaos.machine import WorkerProc


def worker(pid: int, node: str, job: int, attempt: int = 1, gen: int = 0, gpus=(0,)) -> WorkerProc:  # type: ignore[no-untyped-def]
    return WorkerProc(pid, 1000 + pid, node, job, attempt, gen, tuple(gpus))


GPU_CASES = {
    "two jobs on one GPU of one node clash": (
        [worker(10, "n1", 1), worker(11, "n1", 2)],
        [Violation(Invariant.GPU_ONCE, "GPU 0 of n1 used by workers of [(1, 1, 0), (2, 1, 0)]")],
    ),
    "a worker and its own child share the GPU": (
        [worker(10, "n1", 1), worker(12, "n1", 1)],
        [],
    ),
    "the same GPU index on two nodes is two GPUs": (
        [worker(10, "n1", 1), worker(11, "n2", 2)],
        [],
    ),
    "an old generation still on the GPU the new one uses clashes": (
        [worker(10, "n1", 1, gen=0), worker(11, "n1", 1, gen=1)],
        [Violation(Invariant.GPU_ONCE, "GPU 0 of n1 used by workers of [(1, 1, 0), (1, 1, 1)]")],
    ),
}


@pytest.mark.parametrize(("procs", "want"), GPU_CASES.values(), ids=GPU_CASES.keys())
def test_gpu_conflicts(procs: list[WorkerProc], want: list[Violation]) -> None:
    assert gpu_conflicts(procs) == want


def test_a_worker_on_a_node_its_attempt_was_not_given_breaks_the_gang() -> None:
    allocated = {(1, 1): frozenset({"n1", "n2"})}
    procs = [worker(10, "n1", 1), worker(11, "n3", 1), worker(12, "n1", 2)]
    assert outside_allocation(procs, allocated) == [
        Violation(Invariant.GANG, "job 1 attempt 1 has a worker on n3, not allocated"),
        Violation(Invariant.GANG, "job 2 attempt 1 has a worker on n1, not allocated"),
    ]


ALLOC = {(1, 1): frozenset({"n1"})}


def test_a_worker_of_an_ended_run_is_allowed_its_grace_then_reported_once() -> None:
    watch = Watch()
    old = [worker(10, "n1", 1)]
    ended = {1: Run("COMPLETED", 1, 0)}
    assert watch.observe(0.0, old, ended, ALLOC) == []
    assert watch.observe(STALE_GRACE_S - 0.5, old, ended, ALLOC) == []
    late = watch.observe(STALE_GRACE_S + 1.0, old, ended, ALLOC)
    assert [v.invariant for v in late] == [Invariant.ONE_LIVE_ATTEMPT]
    assert watch.observe(STALE_GRACE_S + 2.0, old, ended, ALLOC) == []  # reported once


def test_a_worker_that_goes_within_its_grace_is_no_violation() -> None:
    watch = Watch()
    moved = {1: Run("RUNNING", 2, 0)}
    assert watch.observe(0.0, [worker(10, "n1", 1)], moved, ALLOC) == []
    assert watch.observe(5.0, [], moved, ALLOC) == []
    assert watch.observe(100.0, [], moved, ALLOC) == []


def test_the_live_generation_is_never_stale() -> None:
    watch = Watch()
    live = {1: Run("RUNNING", 1, 0)}
    for t in (0.0, 50.0, 100.0):
        assert watch.observe(t, [worker(10, "n1", 1)], live, ALLOC) == []


def test_a_job_that_leaves_a_terminal_state_is_caught() -> None:
    watch = Watch()
    assert watch.observe(0.0, [], {1: Run("COMPLETED", 1, 0)}, {}) == []
    assert watch.observe(1.0, [], {1: Run("RUNNING", 2, 0)}, {}) == [
        Violation(Invariant.NO_JOB_LOST, "job 1 left COMPLETED for RUNNING")
    ]


TRANSITIONS = {
    "n1": [NodeSample(10.0, "UP"), NodeSample(11.0, "FAILED"), NodeSample(13.0, "UP"),
           NodeSample(14.0, "SUSPECT"), NodeSample(14.2, "UP")],
}  # fmt: skip
FAILED_SINCE_11 = (
    "allocation 7 placed on n1 while it was FAILED (since 11.000; the placer began at 11.500)"
)
PLACEMENT_CASES = {
    "placed by a transaction that began after the fault committed": (
        Placement(7, "n1", began=11.5, inserted=11.6),
        [Violation(Invariant.EXCLUDED_NODE, FAILED_SINCE_11)],
    ),
    "began before the fault committed: it may have read the node UP": (
        Placement(7, "n1", began=10.9, inserted=11.1), [],
    ),
    "the node came back before the row was written: it may have read it UP": (
        Placement(7, "n1", began=12.9, inserted=13.1), [],
    ),
    "a SUSPECT moment the placer's read may have fallen after": (
        Placement(7, "n1", began=14.1, inserted=14.3), [],
    ),
    "excluded throughout a short SUSPECT": (
        Placement(7, "n1", began=14.05, inserted=14.1),
        [Violation(Invariant.EXCLUDED_NODE,
                   "allocation 7 placed on n1 while it was SUSPECT (since 14.000; the placer"
                   " began at 14.050)")],
    ),
    "placed after it came back": (Placement(7, "n1", began=13.5, inserted=13.6), []),
    "a node with no recorded state is not judged": (Placement(7, "n9", 11.5, 11.6), []),
}  # fmt: skip


@pytest.mark.parametrize(
    ("placement", "want"), PLACEMENT_CASES.values(), ids=PLACEMENT_CASES.keys()
)
def test_excluded_placements(placement: Placement, want: list[Violation]) -> None:
    assert excluded_placements(TRANSITIONS, [placement]) == want


def test_tally_names_every_invariant() -> None:
    got = tally([Violation(Invariant.USAGE_ONCE, "x"), Violation(Invariant.USAGE_ONCE, "y")])
    assert got == {"1": 0, "2": 0, "3": 0, "4": 0, "5": 0, "6": 2, "7": 0, "8": 0, "9": 0}


def started(pid: int, job: int, at: float) -> WorkerProc:
    return WorkerProc(pid, 1000 + pid, "n3", job, 1, 0, (1,), started=at)


def test_a_worker_started_after_its_run_ended_is_caught_at_once() -> None:
    # Seen in soak seed 100: an ended attempt's worker started again 0.18 s after the
    # job COMPLETED, on the GPU the placer had given to the next job.
    watch = Watch()
    ended = {127: Run("COMPLETED", 1, 0, ended_at=100.0)}
    got = watch.observe(
        100.5, [started(12367, 127, at=100.18)], ended, {(127, 1): frozenset({"n3"})}
    )
    assert got == [
        Violation(
            Invariant.ONE_LIVE_ATTEMPT,
            "pid 12367 of job 127 attempt 1 generation 0 on n3 started 0.18 s after its run"
            " ended COMPLETED",
        )
    ]
    assert (
        watch.observe(101.0, [started(12367, 127, at=100.18)], ended, {(127, 1): frozenset({"n3"})})
        == []
    )


def test_a_worker_that_started_before_its_run_ended_has_its_grace() -> None:
    watch = Watch()
    ended = {127: Run("COMPLETED", 1, 0, ended_at=100.0)}
    assert (
        watch.observe(100.5, [started(12032, 127, at=95.0)], ended, {(127, 1): frozenset({"n3"})})
        == []
    )


def test_a_lease_changes_holder_only_with_a_higher_epoch() -> None:
    watch = LeaseWatch()
    assert watch.observe({"placer": ("a", 1), "launcher shard 0": ("", 0)}) == []
    assert watch.observe({"placer": ("a", 1), "launcher shard 0": ("x", 1)}) == []
    assert watch.observe({"placer": ("b", 2), "launcher shard 0": ("y", 2)}) == []
    [same] = watch.observe({"placer": ("c", 2), "launcher shard 0": ("y", 2)})
    assert same.invariant is Invariant.ONE_OWNER and "epoch 2 held by b then c" in same.detail
    [back] = watch.observe({"placer": ("c", 2), "launcher shard 0": ("z", 1)})
    assert "launcher shard 0: epoch went back from 2 to 1" in back.detail
