"""What a pass keeps from the last pass over the same nodes (marked.Marked: the running
jobs marked, pool counts, running releases) is exactly what a fresh build gives."""

from __future__ import annotations

import random

import msgspec

from services.placer.core import NodeState, Running
from services.placer.core.index import ClusterIndex
from services.placer.core.marked import Marked
from services.placer.core.place import prepare
from services.placer.core.releases import running_releases
from tests.unit.placer.helpers import T0, grant, leafy, running, snapshot


def _fresh(ix: ClusterIndex, jobs: tuple[Running, ...]) -> tuple[list[int], ...]:
    m = Marked(ix._sk, ix.taken, jobs)
    return m.free, m.avail, m.jobs_on


def _counts(ix: ClusterIndex, key: tuple[str, None, None, bool]) -> tuple[object, object]:
    pool = ix.pool(*key)
    return pool.ge, pool.buckets


def test_a_pass_after_a_pass_marks_and_counts_as_a_fresh_one() -> None:
    rng = random.Random(7)
    nodes = list(leafy(8, 4))
    nodes[3] = msgspec.structs.replace(nodes[3], state=NodeState.DOWN)
    cluster = tuple(nodes)
    jobs: dict[int, Running] = {}
    now, next_id = T0, 1
    for step in range(60):
        for job_id in rng.sample(sorted(jobs), k=min(len(jobs), rng.randint(0, 3))):
            del jobs[job_id]
        for _ in range(rng.randint(0, 3)):
            n = rng.randrange(8)
            gpus = tuple(sorted(rng.sample(range(8), k=rng.randint(1, 3))))
            extra = [grant(f"n{(n + 1) % 8:02d}", 0)] if rng.random() < 0.2 else []
            jobs[next_id] = running(
                next_id,
                grant(f"n{n:02d}", *gpus),
                *extra,
                exclusive=rng.random() < 0.1,
                predicted_s=rng.choice([None, 600, 5000]),
                started_at=now - rng.randint(0, 4000),
                preempted_by=9999 if rng.random() < 0.05 else None,
            )
            next_id += 1
        now += rng.randint(1, 900)
        snap = snapshot(*cluster, running=tuple(jobs.values()))
        prep = prepare(snap, now)
        ix = prep.ix
        assert (ix.free, ix.avail, ix.jobs_on) == _fresh(ix, snap.running), step
        if step % 3 == 0 and ix.avail[0] > 0:
            ix.take(0, ix.free[0] & -ix.free[0])  # a pool made after a change in the pass
        key = ("p", None, None, False)
        want = ix._build_pool(key, ix.avail)
        assert _counts(ix, key) == (want.ge, want.buckets), step
        fresh = Marked(ix._sk, ix.taken, snap.running)
        again = running_releases(snap.running, ix.running_gpus, now, True, fresh)
        assert prep.future.releases() == sorted(again), step
