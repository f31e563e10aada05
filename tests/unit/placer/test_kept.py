"""GPUs a partition keeps for its own jobs (`reserved_gpus`)."""

from __future__ import annotations

from services.placer.core.kept import place_keeping
from services.placer.core.model import Grant, Snapshot, Waiting
from tests.unit.placer.helpers import T0, gang, grant, node, running


def cluster(*busy: object) -> Snapshot:
    return Snapshot(
        nodes=(
            node("a", 4, partitions=("normal",)),
            node("b", 4, partitions=("normal", "debug")),
        ),
        running=tuple(busy),  # type: ignore[arg-type]
    )


def grants_of(plan: object, job_id: int) -> tuple[Grant, ...] | None:
    starts = {s.job_id: s.grants for s in plan.starts}  # type: ignore[attr-defined]
    return starts.get(job_id)


def test_other_partitions_leave_the_kept_gpus_free() -> None:
    pending = [gang(1, 2, gpus_per_node=4), gang(2, 1, gpus_per_node=2)]
    plan = place_keeping(cluster(), pending, T0, {"debug": 2})
    assert grants_of(plan, 2) == (Grant(node="b", gpus=(0, 1)),)  # around b's kept 2 and 3
    # job 1 needs all of b: it fits only on GPUs debug keeps, so it can never start here;
    # before, it waited RESOURCES with a start 31 years ahead
    [never] = [w for w in plan.waits if w.job_id == 1]
    assert (never.reason, never.estimated_start) == (Waiting.BAD_CONSTRAINTS, None)
    assert "partition(s) debug keep for their own jobs" in never.detail


def test_a_job_waiting_for_busy_gpus_keeps_its_estimated_start() -> None:
    busy = running(9, grant("a", 0, 1, 2, 3), partition="normal")
    plan = place_keeping(cluster(busy), [gang(1, 1, gpus_per_node=4)], T0, {"debug": 2})
    [wait] = plan.waits
    assert wait.reason is Waiting.RESOURCES and wait.estimated_start == T0 + 3600


def test_a_debug_job_gets_the_kept_gpus_even_when_the_rest_is_full() -> None:
    full = running(9, grant("a", 0, 1, 2, 3), grant("b", 0, 1), partition="normal")
    pending = [
        gang(1, 1, gpus_per_node=2, partition="normal"),
        gang(2, gpus_per_node=2, partition="debug"),
    ]
    plan = place_keeping(cluster(full), pending, T0, {"debug": 2})
    assert grants_of(plan, 2) == (Grant(node="b", gpus=(2, 3)),)
    assert grants_of(plan, 1) is None


def test_a_kept_gpu_held_by_another_job_is_not_taken_from_it() -> None:
    squatter = running(9, grant("b", 2, 3), partition="normal")
    plan = place_keeping(cluster(squatter), [gang(1, gpus_per_node=2)], T0, {"debug": 2})
    # the two GPUs kept for debug are busy, so debug keeps b's 0 and 1 instead
    assert grants_of(plan, 1) == (Grant(node="a", gpus=(0, 1)),)


def test_without_kept_gpus_it_is_plain_place() -> None:
    plan = place_keeping(cluster(), [gang(1, gpus_per_node=4)], T0, {})
    assert grants_of(plan, 1) is not None
