"""Table tests: an --exclusive job books, backfills and preempts like a whole-node request.

Slurm's own backfill and preemption scenarios on an 8 x 8-GPU cluster, each replayed
twice: once as most training scripts say it (`-N 8 --exclusive`, no GPU count) and once
as an explicit whole-node request (`--gpus-per-node=8`). Both must give the same plan.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.placer.core import (
    Backfill,
    Fit,
    Grant,
    JobRequest,
    Plan,
    Preempt,
    Snapshot,
    Start,
    Wait,
    Waiting,
    place,
)
from tests.unit.placer.helpers import T0, gang, node, running, snapshot, whole

H = 3600.0
NAMES = [f"n{i:02d}" for i in range(8)]
NODES = tuple(node(n) for n in NAMES)
EXCLUSIVE: dict[str, Any] = {"gpus_per_node": 0, "exclusive": True}
WHOLE: dict[str, Any] = {"gpus_per_node": 8}


def grants(names: list[str]) -> tuple[Grant, ...]:
    return tuple(Grant(node=n, gpus=tuple(range(8))) for n in names)


def backfill_scenario(ask: dict[str, Any]) -> tuple[Snapshot, list[JobRequest], Plan]:
    """Job 1 holds n00-n03 for another hour. Job 2 wants all 8 nodes; job 3 (4 nodes, two
    hours) would delay it and must wait; job 4 (4 nodes, half an hour) ends before job
    2's booked start and is backfilled on n04-n07."""
    snap = snapshot(*NODES, running=(running(1, *(whole(n) for n in NAMES[:4])),))
    pending = [
        gang(2, nodes=8, priority=10, time_limit_s=7200, **ask),
        gang(3, nodes=4, time_limit_s=7200, **ask),
        gang(4, nodes=4, time_limit_s=1800, **ask),
    ]
    want = Plan(
        starts=(
            Start(
                job_id=4,
                grants=grants(NAMES[4:]),
                backfilled=True,
                fit=Fit.FLAT,
                backfill=Backfill.BEFORE_RESERVED_START,
                around=2,
            ),
        ),
        waits=(
            Wait(job_id=2, reason=Waiting.RESOURCES, estimated_start=T0 + H),
            Wait(
                job_id=3,
                reason=Waiting.PRIORITY,
                detail="behind job 2",
                estimated_start=T0 + 3 * H,
            ),
        ),
    )
    return snap, pending, want


def preemption_scenario(ask: dict[str, Any]) -> tuple[Snapshot, list[JobRequest], Plan]:
    """Eight lower-tier jobs hold one whole node each; an urgent 8-node job preempts all
    of them and waits out the longest grace."""
    snap = snapshot(
        *NODES,
        running=tuple(
            running(10 + k, whole(n), grace_s=30 + k, started_at=T0 - 600 - k)
            for k, n in enumerate(NAMES)
        ),
    )
    pending = [gang(1, nodes=8, tier=1, can_preempt=True, **ask)]
    victims = ", ".join(str(10 + k) for k in range(8))
    want = Plan(
        preemptions=tuple(
            Preempt(victim_job_id=10 + k, for_job_id=1, grace_s=30 + k) for k in range(8)
        ),
        waits=(
            Wait(
                job_id=1,
                reason=Waiting.PREEMPTING,
                detail=f"waiting for {victims} to exit",
                estimated_start=T0 + 37,
            ),
        ),
    )
    return snap, pending, want


def partial_scenario(ask: dict[str, Any]) -> tuple[Snapshot, list[JobRequest], Plan]:
    """Small jobs dot every node; a 2-node job is booked where whole nodes come free
    first, and the next small job may not take the GPUs that booking holds."""
    snap = snapshot(
        *NODES,
        running=(
            *(
                running(20 + k, Grant(node=n, gpus=(0,)), time_limit_s=7200)
                for k, n in enumerate(NAMES[:6])
            ),
            running(30, Grant(node="n06", gpus=(0,)), time_limit_s=3600 + 600),
            running(31, Grant(node="n07", gpus=(0,)), time_limit_s=3600 + 900),
        ),
    )
    pending = [
        gang(1, nodes=2, priority=10, time_limit_s=7200, **ask),
        gang(2, nodes=1, gpus_per_node=4, time_limit_s=7200),
    ]
    want = Plan(
        starts=(
            Start(
                job_id=2,
                grants=(Grant(node="n00", gpus=(1, 2, 3, 4)),),
                backfilled=True,
                fit=Fit.NODE,
                backfill=Backfill.ON_UNRESERVED_GPUS,
                around=1,
            ),
        ),
        waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + 900),),
    )
    return snap, pending, want


SCENARIOS = {
    "a wide job is booked and a long later one may not jump ahead; a short one backfills": (
        backfill_scenario
    ),
    "an urgent wide job preempts every lower-tier job on the nodes it needs": (preemption_scenario),
    "a booking on nodes busy now holds them whole once they come free": partial_scenario,
}


@pytest.mark.parametrize("ask", [EXCLUSIVE, WHOLE], ids=["--exclusive", "--gpus-per-node=8"])
@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_exclusive_is_a_whole_node_request(scenario: Any, ask: dict[str, Any]) -> None:
    snap, pending, want = scenario(ask)
    assert place(snap, pending, now=T0) == want
