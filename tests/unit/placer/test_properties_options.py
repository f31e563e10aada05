"""The core's properties (test_properties.py) under the policy options: the service's
MUSTER_POLICY (fragmentation score) and every measured option on at once (leaf wait,
protected head, size-scaled age bound)."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import MUSTER_POLICY, JobRequest, PolicyConfig, Snapshot, Waiting, place
from tests.unit.placer.helpers import T0
from tests.unit.placer.test_properties import _after, _busy, worlds

ALL_ON = msgspec.structs.replace(
    MUSTER_POLICY, gang_leaf_wait_s=3600, protect_oldest=True, age_ref_gpus=8
)
CONFIGS = pytest.mark.parametrize("config", [MUSTER_POLICY, ALL_ON], ids=["muster", "all-on"])


@CONFIGS
@settings(max_examples=100, deadline=None)
@given(world=worlds())
def test_no_gpu_is_double_booked_and_gangs_are_whole(
    config: PolicyConfig, world: tuple[Snapshot, list[JobRequest]]
) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0, config=config)
    jobs = {j.job_id: j for j in pending}
    decided = [s.job_id for s in plan.starts] + [w.job_id for w in plan.waits]
    assert sorted(decided) == sorted(jobs)
    taken = _busy(snap)
    for s in plan.starts:
        job = jobs[s.job_id]
        for g in s.grants:
            assert g.node not in job.excluded_nodes
            for i in g.gpus:
                assert (g.node, i) not in taken, "GPU double-booked"
                taken.add((g.node, i))
        if job.gpus_total is None and not job.exclusive:
            assert job.nodes_min <= len(s.grants) <= job.nodes_max


@CONFIGS
@settings(max_examples=60, deadline=None)
@given(world=worlds(), rnd=st.randoms(use_true_random=False))
def test_same_input_same_plan_whatever_the_queue_order(
    config: PolicyConfig, world: tuple[Snapshot, list[JobRequest]], rnd: random.Random
) -> None:
    snap, pending = world
    shuffled = list(pending)
    rnd.shuffle(shuffled)
    assert place(snap, pending, T0, config) == place(snap, shuffled, T0, config)


@CONFIGS
@settings(max_examples=100, deadline=None)
@given(world=worlds(extras=False))
def test_backfill_never_delays_the_reserved_job(
    config: PolicyConfig, world: tuple[Snapshot, list[JobRequest]]
) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0, config=config)
    top = next((w for w in plan.waits if w.reason is Waiting.RESOURCES), None)
    if top is None or top.estimated_start is None:
        return
    job = next(j for j in pending if j.job_id == top.job_id)
    later = _after(snap, plan, pending, top.estimated_start)
    replay = place(later, [job], now=top.estimated_start, config=config)
    assert [s.job_id for s in replay.starts] == [job.job_id], "backfill pushed it back"
