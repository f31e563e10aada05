"""Table tests: the fragmentation score for one-node jobs and the gang leaf wait."""

from __future__ import annotations

import pytest

from services.placer.core import (
    MUSTER_POLICY,
    Fit,
    JobRequest,
    Plan,
    PolicyConfig,
    Snapshot,
    Start,
    Wait,
    Waiting,
    place,
    prepare,
)
from tests.unit.placer.helpers import T0, gang, grant, leafy, running, snapshot, whole

PACK = PolicyConfig(pack_small=True)
LEAF_WAIT = PolicyConfig(gang_leaf_wait_s=7200)

# leaf0: n00 whole free, n01 busy; leaf1: n02 with 4 GPUs free, n03 whole free
HALF_USED = snapshot(
    *leafy(4, per_leaf=2),
    running=(running(8, whole("n01")), running(9, grant("n02", 0, 1, 2, 3))),
)
# two leaves of two nodes, one node of each busy: a 2-node gang fits only across leaves
SPLIT = snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00"), whole("n02")),))

# every node busy; they free at +1800 (n02), +3600 (n00), +5400 (n03), +7200 (n01)
STAGGERED = snapshot(
    *leafy(4, per_leaf=2),
    running=(
        running(8, whole("n00")),
        running(9, whole("n01"), started_at=T0),
        running(10, whole("n02"), started_at=T0 - 5400),
        running(11, whole("n03"), started_at=T0 - 1800),
    ),
)


def started(job_id: int, node_name: str, *gpus: int, fit: Fit = Fit.NODE) -> Plan:
    return Plan(starts=(Start(job_id=job_id, grants=(grant(node_name, *gpus),), fit=fit),))


CASES: dict[str, tuple[Snapshot, list[JobRequest], PolicyConfig, Plan]] = {
    "without the score: the tightest leaf, whose one node is whole, is broken": (
        HALF_USED,
        [gang(1, gpus_per_node=2)],
        PolicyConfig(),
        started(1, "n00", 0, 1),
    ),
    "with the score: the partly used node in another leaf, whole nodes stay whole": (
        HALF_USED,
        [gang(1, gpus_per_node=2)],
        PACK,
        started(1, "n02", 4, 5),
    ),
    "a whole node is broken only when no partly used node holds the job": (
        HALF_USED,
        [gang(1, gpus_per_node=6)],
        PACK,
        started(1, "n00", 0, 1, 2, 3, 4, 5),
    ),
    "equal best fits: the leaf with fewer whole free nodes": (
        snapshot(
            *leafy(4, per_leaf=2),
            running=(running(8, grant("n00", 0, 1, 2, 3)), running(9, grant("n02", 0, 1, 2, 3))),
        ),
        [gang(1, gpus_per_node=4)],
        PACK,
        started(1, "n00", 4, 5, 6, 7),
    ),
    "a whole node to break: in the leaf with the fewest whole free nodes": (
        snapshot(*leafy(6, per_leaf=3), running=(running(9, whole("n03")),)),
        [gang(1, gpus_per_node=8)],
        PACK,
        started(1, "n04", *range(8)),
    ),
    "the muster policy packs": (
        HALF_USED,
        [gang(1, gpus_per_node=2)],
        MUSTER_POLICY,
        started(1, "n02", 4, 5),
    ),
    "a gang spreads when no leaf holds it within the leaf wait": (
        SPLIT,
        [gang(1, nodes=2, gpus_per_node=8)],
        PolicyConfig(gang_leaf_wait_s=1800),  # the busy nodes free in an hour
        Plan(
            starts=(
                Start(
                    job_id=1,
                    grants=(grant("n01", *range(8)), grant("n03", *range(8))),
                    fit=Fit.ACROSS_SWITCHES,
                ),
            )
        ),
    ),
    "a gang waits, booked, for the leaf that holds it within the leaf wait": (
        SPLIT,
        [gang(1, nodes=2, gpus_per_node=8), gang(2, gpus_per_node=8, time_limit_s=7200)],
        LEAF_WAIT,
        Plan(
            starts=(Start(job_id=2, grants=(grant("n03", *range(8)),), fit=Fit.NODE),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.TOPOLOGY,
                    detail="one leaf switch (leaf0) holds it from then",
                    estimated_start=T0 + 3600,
                ),
            ),
        ),
    ),
    "without the leaf wait a blocked gang books the first nodes to free, over two leaves": (
        STAGGERED,
        [gang(1, nodes=2, gpus_per_node=8)],
        PolicyConfig(),
        Plan(waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + 3600),)),
    ),
    "with it, the leaf that frees within the wait after that": (
        STAGGERED,
        [gang(1, nodes=2, gpus_per_node=8)],
        LEAF_WAIT,
        Plan(waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + 5400),)),
    ),
    "an elastic gang is not held: it spreads to grow": (
        SPLIT,
        [gang(1, nodes=(1, 2), gpus_per_node=8)],
        LEAF_WAIT,
        Plan(
            starts=(
                Start(
                    job_id=1,
                    grants=(grant("n01", *range(8)), grant("n03", *range(8))),
                    fit=Fit.ACROSS_SWITCHES,
                ),
            )
        ),
    ),
    "a gang wider than any leaf is not held": (
        snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00")),)),
        [gang(1, nodes=3, gpus_per_node=8)],
        LEAF_WAIT,
        Plan(
            starts=(
                Start(
                    job_id=1,
                    grants=tuple(grant(n, *range(8)) for n in ("n01", "n02", "n03")),
                    fit=Fit.ACROSS_SWITCHES,
                ),
            )
        ),
    ),
}


@pytest.mark.parametrize(("snap", "pending", "config", "want"), CASES.values(), ids=CASES.keys())
def test_fragmentation(
    snap: Snapshot, pending: list[JobRequest], config: PolicyConfig, want: Plan
) -> None:
    assert place(snap, pending, now=T0, config=config) == want


def test_packing_is_deterministic_and_matches_the_incremental_path() -> None:
    job = gang(1, gpus_per_node=2)
    full = place(HALF_USED, [job], now=T0, config=PACK)
    one = prepare(HALF_USED, T0, PACK).place_one(job)
    assert full == one == place(HALF_USED, [job], now=T0, config=PACK)


def test_protect_oldest_tries_the_oldest_job_first_then_the_score() -> None:
    """Two free GPUs: the score starts the small young job; protecting the oldest tries
    the old whole-node job first, whose booking holds them, so the young one waits."""
    snap = snapshot(*leafy(1, per_leaf=1), running=(running(9, grant("n00", *range(6))),))
    old = gang(1, gpus_per_node=8, time_limit_s=7200, submitted_at=T0 - 5000)
    young = gang(2, gpus_per_node=2, time_limit_s=7200)
    scored = PolicyConfig(service_weight=10.0)
    assert [s.job_id for s in place(snap, [old, young], T0, scored).starts] == [2]
    protected = PolicyConfig(service_weight=10.0, protect_oldest=True)
    plan = place(snap, [old, young], T0, protected)
    assert plan.starts == ()
    assert [(w.job_id, w.reason) for w in plan.waits] == [
        (1, Waiting.RESOURCES),
        (2, Waiting.PRIORITY),
    ]
