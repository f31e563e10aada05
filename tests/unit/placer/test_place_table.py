"""Table tests of the placer core: placement, order, constraints (whole-value plans)."""

from __future__ import annotations

import pytest

from services.placer.core import (
    Backfill,
    Blocker,
    Fit,
    Grant,
    NodeState,
    Plan,
    Snapshot,
    Start,
    Wait,
    Waiting,
    place,
)
from services.placer.core.model import JobRequest
from tests.unit.placer.helpers import T0, gang, grant, leafy, node, running, snapshot, whole

H = 3600.0
FREE_AT = T0 + H  # running() jobs started an hour ago with a two-hour limit


def start(
    job_id: int,
    *grants: tuple[str, tuple[int, ...]],
    fit: Fit,
    domain: str = "",
    backfill: Backfill = Backfill.NO,
    around: int | None = None,
) -> Start:
    """A start as the core gives it: backfilled whenever it went around a waiting job."""
    return Start(
        job_id=job_id,
        grants=tuple(Grant(node=n, gpus=g) for n, g in grants),
        backfilled=backfill is not Backfill.NO,
        fit=fit,
        domain=domain,
        backfill=backfill,
        around=around,
    )


ALL8 = tuple(range(8))

CASES: dict[str, tuple[Snapshot, list[JobRequest], Plan]] = {
    "a gang is all-or-nothing and waits for the node that frees first": (
        snapshot(node("a"), node("b"), running=(running(9, grant("b", 0, 1, 2, 3)),)),
        [gang(1, nodes=2, gpus_per_node=8)],
        Plan(waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=FREE_AT),)),
    ),
    "a one-GPU job goes to the fullest node that still fits it": (
        snapshot(node("a"), node("b"), running=(running(9, grant("b", *range(6))),)),
        [gang(1, gpus_per_node=1)],
        Plan(starts=(start(1, ("b", (6,)), fit=Fit.NODE),)),
    ),
    "GPUs inside a node come from one locality group": (
        snapshot(node("a", groups=2), running=(running(9, grant("a", 0)),)),
        [gang(1, gpus_per_node=4)],
        Plan(starts=(start(1, ("a", (4, 5, 6, 7)), fit=Fit.NODE),)),
    ),
    "a gang goes into the tightest leaf switch that holds it whole": (
        snapshot(
            *leafy(8, per_leaf=4),
            running=(running(9, whole("n00"), whole("n01")), running(8, whole("n04"))),
        ),
        [gang(1, nodes=2, gpus_per_node=8), gang(2, nodes=3, gpus_per_node=8)],
        Plan(
            starts=(
                start(
                    1,
                    ("n02", ALL8),
                    ("n03", ALL8),
                    fit=Fit.SWITCH,
                    domain="leaf0",
                ),
                start(
                    2,
                    ("n05", ALL8),
                    ("n06", ALL8),
                    ("n07", ALL8),
                    fit=Fit.SWITCH,
                    domain="leaf1",
                ),
            )
        ),
    ),
    "an elastic gang takes what is free when that is at least its minimum": (
        snapshot(node("a"), node("b"), node("c"), node("d"), running=(running(9, whole("d")),)),
        [gang(1, nodes=(2, 4), gpus_per_node=8)],
        Plan(
            starts=(
                start(
                    1,
                    ("a", ALL8),
                    ("b", ALL8),
                    ("c", ALL8),
                    fit=Fit.FLAT,
                ),
            )
        ),
    ),
    "down, draining and failed nodes and unhealthy GPUs are never used": (
        snapshot(
            node("a", state=NodeState.DOWN),
            node("b", state=NodeState.DRAINING),
            node("c", state=NodeState.FAILED),
            node("d", unhealthy=(0, 1, 2, 3, 4, 5, 6)),
        ),
        [gang(1, gpus_per_node=2), gang(2, gpus_per_node=1)],
        Plan(
            starts=(
                start(
                    2,
                    ("d", (7,)),
                    fit=Fit.NODE,
                    backfill=Backfill.ON_UNRESERVED_GPUS,
                    around=1,
                ),
            ),
            waits=(Wait(job_id=1, reason=Waiting.RESOURCES),),
        ),
    ),
    "excluded nodes are avoided and required nodes are used": (
        snapshot(node("a"), node("b"), node("c")),
        [
            gang(1, gpus_per_node=8, excluded_nodes=("a",)),
            gang(2, gpus_per_node=8, required_nodes=("c",)),
        ],
        Plan(
            starts=(
                start(1, ("b", ALL8), fit=Fit.NODE),
                start(2, ("c", ALL8), fit=Fit.NODE),
            )
        ),
    ),
    "held jobs and jobs with a blocker wait with that blocker's reason": (
        snapshot(node("a")),
        [
            gang(1, held=True),
            gang(2, blocked_by=Blocker(reason=Waiting.DEPENDENCY, detail="afterok:7")),
            gang(3, blocked_by=Blocker(reason=Waiting.JOB_ARRAY_TASK_LIMIT)),
        ],
        Plan(
            waits=(
                Wait(job_id=1, reason=Waiting.HELD, detail="held"),
                Wait(job_id=2, reason=Waiting.DEPENDENCY, detail="afterok:7"),
                Wait(job_id=3, reason=Waiting.JOB_ARRAY_TASK_LIMIT),
            )
        ),
    ),
    "order is tier, then priority, then submit time, then id": (
        snapshot(node("a", 3)),
        [
            gang(1, gpus_per_node=1),
            gang(2, gpus_per_node=1, priority=5.0),
            gang(3, gpus_per_node=1, tier=1),
            gang(4, gpus_per_node=1, priority=5.0, submitted_at=T0 - 5000),
        ],
        Plan(
            starts=(
                start(3, ("a", (0,)), fit=Fit.NODE),
                start(4, ("a", (1,)), fit=Fit.NODE),
                start(2, ("a", (2,)), fit=Fit.NODE),
            ),
            waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + H),),
        ),
    ),
    "impossible requests are bad constraints, an all-down partition is down": (
        snapshot(
            node("a", 4, partitions=("normal",)),
            node("g", 8, partitions=("gpu",), state=NodeState.DOWN),
        ),
        [
            gang(1, gpus_per_node=16),
            gang(2, gpu_model="H100"),
            gang(3, partition="gpu"),
            gang(4, nodes=(3, 2)),
        ],
        Plan(
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.BAD_CONSTRAINTS,
                    detail="nodes have at most 4 healthy GPUs",
                ),
                Wait(
                    job_id=2,
                    reason=Waiting.BAD_CONSTRAINTS,
                    detail="no node serves partition normal with H100 GPUs",
                ),
                Wait(
                    job_id=3,
                    reason=Waiting.PARTITION_DOWN,
                    detail="no node of partition gpu is up",
                ),
                Wait(
                    job_id=4,
                    reason=Waiting.BAD_CONSTRAINTS,
                    detail="nodes must be 1 <= min <= max, GPUs >= 0",
                ),
            )
        ),
    ),
    "a GPU total is laid out over as few nodes as possible": (
        snapshot(node("a"), node("b"), node("c"), running=(running(9, grant("c", 0, 1, 2, 3)),)),
        [gang(1, gpus_total=12)],
        Plan(
            starts=(
                start(
                    1,
                    ("a", ALL8),
                    ("c", (4, 5, 6, 7)),
                    fit=Fit.FLAT,
                ),
            )
        ),
    ),
    "an exclusive job gets whole idle nodes and a zero-GPU job gets a slot": (
        snapshot(node("a"), node("b"), running=(running(9, grant("a", 0)),)),
        [gang(1, gpus_per_node=2, exclusive=True), gang(2, gpus_per_node=0)],
        Plan(
            starts=(
                start(1, ("b", ALL8), fit=Fit.NODE),
                start(2, ("a", ()), fit=Fit.NODE),
            )
        ),
    ),
    "a gang stays inside one NVLink block when a block holds it": (
        snapshot(
            node("a", topology=("leaf0",), block="nvl0"),
            node("b", topology=("leaf0",), block="nvl1"),
            node("c", topology=("leaf0",), block="nvl1"),
            node("d", topology=("leaf0",), block="nvl0"),
            running=(running(9, whole("a")),),
        ),
        [gang(1, nodes=2, gpus_per_node=8)],
        Plan(
            starts=(
                start(
                    1,
                    ("b", ALL8),
                    ("c", ALL8),
                    fit=Fit.BLOCK,
                    domain="nvl1",
                ),
            )
        ),
    ),
    "partitions and GPU models keep jobs on their own nodes": (
        snapshot(
            node("cpu", 0, partitions=("cpu",)),
            node("h", 8, model="H100", partitions=("gpu",)),
            node("a", 8, model="A100", partitions=("gpu",)),
        ),
        [
            gang(1, gpus_per_node=2, partition="gpu", gpu_model="A100"),
            gang(2, partition="cpu"),
            gang(3, gpus_per_node=1, partition="gpu", gpu_model="H100"),
        ],
        Plan(
            starts=(
                start(1, ("a", (0, 1)), fit=Fit.NODE),
                start(2, ("cpu", ()), fit=Fit.NODE),
                start(3, ("h", (0,)), fit=Fit.NODE),
            )
        ),
    ),
    "required nodes that are down, or too few nodes once excluded, wait NODES_EXCLUDED": (
        snapshot(node("a"), node("b", state=NodeState.DOWN), node("c")),
        [
            gang(1, gpus_per_node=1, required_nodes=("b",)),
            gang(2, nodes=2, gpus_per_node=1, excluded_nodes=("a", "c")),
            gang(3, gpus_per_node=1, required_nodes=("zz",)),
        ],
        Plan(
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.NODES_EXCLUDED,
                    detail="required nodes not up: b",
                ),
                Wait(
                    job_id=2,
                    reason=Waiting.NODES_EXCLUDED,
                    detail="too few nodes left once the excluded ones are out",
                ),
                Wait(job_id=3, reason=Waiting.BAD_CONSTRAINTS, detail="unknown nodes zz"),
            )
        ),
    ),
}


@pytest.mark.parametrize(("snap", "pending", "want"), CASES.values(), ids=CASES.keys())
def test_place(snap: Snapshot, pending: list[JobRequest], want: Plan) -> None:
    assert place(snap, pending, now=T0) == want


def test_a_running_job_on_a_node_gone_from_the_snapshot_is_ignored() -> None:
    snap = snapshot(node("a"), running=(running(9, whole("gone"), grant("a", 0)),))
    plan = place(snap, [gang(1, gpus_per_node=8)], now=T0)
    assert plan.waits == (Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + H),)
