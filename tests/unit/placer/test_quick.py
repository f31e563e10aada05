"""The fast paths of a pass give exactly the full path's answers.

quick.py answers plain jobs that cannot fit from pool counts; preempt.Victims keeps the
victim order built once per prepared cluster; select_total on the live index reads
domain sums from the count rows. Each is checked against the path it shortcuts: a
table of situations, then random worlds with the fast path switched off.
"""

from __future__ import annotations

import gc
import random
from typing import Any

import msgspec
import pytest

from services.placer.core import (
    MUSTER_POLICY,
    Blocker,
    JobRequest,
    Limit,
    Limits,
    Plan,
    PolicyConfig,
    Reservation,
    Snapshot,
    Wait,
    Waiting,
    place,
    prepare,
)
from services.placer.core.gc_pause import gc_paused
from services.placer.core.preempt import candidates
from services.placer.core.select import CandidateView, IndexView, select_total
from tests.unit.placer.helpers import T0, gang, grant, leafy, running, snapshot, whole

BUSY = snapshot(
    *leafy(8, per_leaf=2),  # n04..n07 idle: 36 GPUs free, 4 whole nodes
    running=(
        running(90, whole("n00"), tier=0),
        running(91, whole("n01"), tier=0),
        running(92, grant("n02", 0, 1, 2, 3), tier=0),
        running(93, whole("n03"), tier=0, preemptible=False),
    ),
)
NO_ROOM_CFG = PolicyConfig(reservation_depth=0)  # no booking left: counts alone decide


def _both(snap: Snapshot, jobs: list[JobRequest], cfg: PolicyConfig) -> tuple[Plan, Plan]:
    """The plan with the quick answers, and the one the full path alone gives."""
    fast = prepare(snap, T0, cfg)
    slow = prepare(snap, T0, cfg)
    slow.quick = None
    return fast.plan(jobs), slow.plan(jobs)


@pytest.mark.parametrize(
    ("job", "cfg", "quick", "want"),
    [
        # a gang no pool count can hold: the first blocked job of the pass
        (gang(1, nodes=5, gpus_per_node=8), NO_ROOM_CFG, True, Waiting.RESOURCES),
        # too wide for any node: no room without a walk
        (gang(1, gpus_per_node=16), NO_ROOM_CFG, False, Waiting.BAD_CONSTRAINTS),
        # a GPU total over several nodes that the free GPUs cannot hold
        (gang(1, gpus_total=40), NO_ROOM_CFG, True, Waiting.RESOURCES),
        # it fits: the quick path steps aside and the full path starts it
        (gang(1, gpus_per_node=4), NO_ROOM_CFG, None, None),
        (gang(1, gpus_total=12), NO_ROOM_CFG, None, None),
        # may preempt: answered by the full blocked path (victims chosen)
        (
            gang(1, nodes=5, gpus_per_node=8, tier=1, can_preempt=True),
            NO_ROOM_CFG,
            True,
            Waiting.PREEMPTING,
        ),
        # a booking is left: the full blocked path books it
        (gang(1, nodes=8, gpus_per_node=8), PolicyConfig(), True, Waiting.RESOURCES),
        # prechecks (cached per key)
        (gang(1, nodes=(3, 2), gpus_per_node=1), NO_ROOM_CFG, False, Waiting.BAD_CONSTRAINTS),
        (gang(1, gpus_per_node=1, time_limit_s=0), NO_ROOM_CFG, False, Waiting.BAD_CONSTRAINTS),
        (gang(1, gpus_per_node=1, gpu_model="h100"), NO_ROOM_CFG, False, Waiting.BAD_CONSTRAINTS),
        # not plain: left to the full path
        (gang(1, gpus_per_node=8, held=True), NO_ROOM_CFG, None, Waiting.HELD),
        (gang(1, nodes=5, gpus_per_node=8, exclusive=True), NO_ROOM_CFG, None, Waiting.RESOURCES),
        (gang(1, gpus_per_node=8, constraint="a"), NO_ROOM_CFG, None, Waiting.BAD_CONSTRAINTS),
        (
            gang(1, gpus_per_node=8, blocked_by=Blocker(reason=Waiting.DEPENDENCY)),
            NO_ROOM_CFG,
            None,
            Waiting.DEPENDENCY,
        ),
    ],
)
def test_a_quick_answer_is_the_full_paths(
    job: JobRequest, cfg: PolicyConfig, quick: bool | None, want: Waiting | None
) -> None:
    """quick: True, answered from counts; False, by a cached precheck; None, not at all."""
    prep = prepare(BUSY, T0, cfg)
    assert prep.quick is not None
    got = prep.quick(job, [])
    if quick is None:
        assert got is None
    else:
        assert got is not None
        assert bool(got.reason is not Waiting.BAD_CONSTRAINTS) == quick
    fast, slow = _both(BUSY, [job], cfg)
    assert fast == slow
    if want is None:
        assert [s.job_id for s in fast.starts] == [1]
    else:
        assert [w.reason for w in fast.waits] == [want]


def test_the_jobs_behind_the_first_blocked_one_wait_for_priority() -> None:
    jobs = [gang(j, nodes=5, gpus_per_node=8, priority=10.0 - j) for j in range(1, 5)]
    fast, slow = _both(BUSY, jobs, NO_ROOM_CFG)
    assert fast == slow
    assert [(w.reason, w.detail) for w in fast.waits] == [
        (Waiting.RESOURCES, ""),
        *[(Waiting.PRIORITY, "behind job 1")] * 3,
    ]


def test_beyond_max_job_test_the_quick_answer_is_not_tested() -> None:
    jobs = [gang(j, nodes=5, gpus_per_node=8, priority=10.0 - j) for j in range(1, 4)]
    cfg = msgspec.structs.replace(NO_ROOM_CFG, max_job_test=1)
    fast, slow = _both(BUSY, jobs, cfg)
    assert fast == slow
    assert fast.waits[2] == Wait(
        job_id=3, reason=Waiting.NOT_TESTED, detail="beyond max_job_test this pass"
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"limits": Limits(user_default=Limit(max_gpus=8))},
        {"reservations": (Reservation(name="m", start=T0 + 60, duration_s=60, maintenance=True),)},
    ],
)
def test_limits_and_windows_take_the_full_path(extra: dict[str, object]) -> None:
    snap = msgspec.structs.replace(BUSY, **extra)
    assert prepare(snap, T0, NO_ROOM_CFG).quick is None
    assert prepare(BUSY, T0, PolicyConfig(strict_order=True)).quick is None


def _world(seed: int) -> tuple[Snapshot, list[JobRequest]]:
    rng = random.Random(seed)
    nodes = leafy(rng.randint(2, 24), per_leaf=rng.choice([2, 4]), leaves_per_spine=2)
    busy = []
    for k, n in enumerate(rng.sample(nodes, rng.randint(0, len(nodes)))):
        gpus = rng.sample(range(8), rng.randint(1, 8))
        busy.append(
            running(
                100 + k,
                grant(n.name, *sorted(gpus)),
                tier=rng.randint(0, 1),
                priority=float(rng.randint(0, 2)),
                started_at=T0 - rng.randint(0, 7000),
                preempted_by=rng.choice([None, None, None, 1, 2]),
                min_runtime_s=rng.choice([0, 0, 3600]),
            )
        )
    jobs = []
    for j in range(1, rng.randint(2, 30)):
        kw: dict[str, Any] = {
            "tier": rng.choice([0, 0, 1]),
            "can_preempt": rng.random() < 0.3,
            "priority": float(rng.randint(0, 3)),
            "time_limit_s": rng.choice([300, 3600, 20_000]),
        }
        if rng.random() < 0.2:
            jobs.append(gang(j, gpus_total=rng.randint(1, 40), **kw))
        else:
            nmin = rng.randint(1, 4)
            jobs.append(gang(j, (nmin, nmin + rng.randint(0, 1)), rng.choice([0, 1, 4, 8]), **kw))
    return snapshot(*nodes, running=tuple(busy)), jobs


CONFIGS = [
    PolicyConfig(),
    MUSTER_POLICY,
    PolicyConfig(reservation_depth=1, preemption=False),
    PolicyConfig(reservation_depth=0, max_preemptors=1, max_job_test=5),
]


@pytest.mark.parametrize("seed", range(60))
def test_random_worlds_plan_the_same_with_and_without_the_quick_answers(seed: int) -> None:
    snap, jobs = _world(seed)
    for cfg in CONFIGS:
        fast, slow = _both(snap, jobs, cfg)
        assert fast == slow


@pytest.mark.parametrize("seed", range(30))
def test_the_victim_order_is_the_one_candidates_sorts(seed: int) -> None:
    snap, jobs = _world(seed)
    prep = prepare(snap, T0, PolicyConfig())
    rng = random.Random(seed)
    ids = [r.job_id for r in snap.running]
    for job in jobs:
        taken = set(rng.sample(ids, rng.randint(0, len(ids))))
        want = candidates(snap.running, taken, job, T0)
        got = [snap.running[p] for p in prep.runs.candidates(taken, job)]
        assert got == want


@pytest.mark.parametrize("seed", range(30))
def test_a_gpu_total_on_the_live_index_lays_out_as_on_an_explicit_view(seed: int) -> None:
    snap, _ = _world(seed)
    prep = prepare(snap, T0, PolicyConfig())
    ix = prep.ix
    pool = ix.pool("normal", None)
    live = IndexView(ix, pool)
    explicit = CandidateView(ix, {i: ix.free[i] for i in live.candidates(1)}, 1)
    for total in range(1, 60, 3):
        for cap in (1, 2, 4, 100):
            assert select_total(ix, live, total, cap) == select_total(ix, explicit, total, cap)


def test_a_pass_leaves_the_garbage_collector_as_it_found_it() -> None:
    jobs = [gang(1, nodes=5, gpus_per_node=8)]
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            if enabled:
                gc.enable()
            else:
                gc.disable()
            with gc_paused():
                assert not gc.isenabled()
            place(BUSY, jobs, now=T0)
            assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
