"""Property tests of the placer core's invariants (hypothesis)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import (
    Grant,
    JobRequest,
    Limit,
    Limits,
    Node,
    NodeState,
    Plan,
    PolicyConfig,
    Recurrence,
    Reservation,
    Running,
    Snapshot,
    Waiting,
    place,
    rank_key,
)
from tests.unit.placer.helpers import T0, gang, node

STATES = [NodeState.UP] * 6 + [NodeState.DOWN, NodeState.DRAINING, NodeState.DRAINED]


@st.composite
def worlds(draw: st.DrawFn, *, extras: bool = True) -> tuple[Snapshot, list[JobRequest]]:
    """A small cluster, some running jobs on disjoint GPUs, and a queue of requests."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    n_nodes = draw(st.integers(1, 10))
    nodes = []
    for i in range(n_nodes):
        gpus = rng.choice([0, 1, 2, 4, 8, 8, 8])
        unhealthy = tuple(g for g in range(gpus) if extras and rng.random() < 0.1)
        nodes.append(
            node(
                f"n{i}",
                gpus,
                state=rng.choice(STATES) if extras else NodeState.UP,
                topology=(f"spine{i // 4}", f"leaf{i // 2}"),
                block=rng.choice([None, f"nvl{i // 3}"]) if extras else None,
                groups=rng.choice([1, 2]),
                unhealthy=unhealthy,
            )
        )
    running: list[Running] = []
    for j in range(rng.randint(0, 6)):
        grants = []
        for n in rng.sample(nodes, rng.randint(1, min(3, len(nodes)))):
            taken = {g for r in running for gr in r.grants if gr.node == n.name for g in gr.gpus}
            free = [g.index for g in n.gpus if g.index not in taken]
            grants.append(Grant(node=n.name, gpus=tuple(rng.sample(free, min(len(free), 2)))))
        running.append(
            Running(
                job_id=1000 + j,
                user="bob",
                account="default",
                tier=rng.randint(0, 2),
                preemptible=rng.random() < 0.8,
                started_at=T0 - rng.randint(0, 7200),
                time_limit_s=rng.randint(600, 14_400),
                min_runtime_s=rng.choice([0, 0, 3600]),
                grants=tuple(grants),
            )
        )
    pending = [_request(j, rng, nodes, extras) for j in range(1, rng.randint(1, 12))]
    extra: dict[str, Any] = {}
    if extras and rng.random() < 0.3:
        extra["reservations"] = (
            Reservation(
                name="r",
                start=T0 + rng.choice([-600, 600, 5000]),
                duration_s=3600,
                nodes=tuple(n.name for n in nodes if rng.random() < 0.4),
                gpus=rng.choice([0, 0, 8]),
                accounts=rng.choice([(), ("default",)]),
                recurrence=rng.choice(list(Recurrence)),
            ),
        )
    if extras and rng.random() < 0.3:
        extra["limits"] = Limits(user_default=Limit(max_gpus=rng.randint(1, 16), max_jobs=3))
    return Snapshot(nodes=tuple(nodes), running=tuple(running), **extra), pending


def _request(job_id: int, rng: random.Random, nodes: list[Node], extras: bool) -> JobRequest:
    nmin = rng.randint(1, 3)
    kw: dict[str, Any] = {
        "priority": float(rng.randint(0, 3)),
        "time_limit_s": rng.choice([300, 3600, 7200, 20_000]),
    }
    if extras:
        kw |= {
            "tier": rng.randint(0, 2),
            "can_preempt": rng.random() < 0.4,
            "exclusive": rng.random() < 0.1,
            "excluded_nodes": tuple(n.name for n in nodes if rng.random() < 0.2),
            "max_switches": rng.choice([None, None, 1]),
        }
        if rng.random() < 0.15:
            return gang(job_id, gpus_total=rng.randint(1, 20), **kw)
    return gang(job_id, (nmin, nmin + rng.randint(0, 1)), rng.choice([0, 1, 2, 4, 8]), **kw)


def _busy(snap: Snapshot) -> set[tuple[str, int]]:
    return {(g.node, i) for r in snap.running for g in r.grants for i in g.gpus}


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_no_gpu_is_double_booked_nor_bad(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    by_name = {n.name: n for n in snap.nodes}
    jobs = {j.job_id: j for j in pending}
    taken = _busy(snap)
    for s in plan.starts:
        job = jobs[s.job_id]
        for g in s.grants:
            n = by_name[g.node]
            assert n.state is NodeState.UP
            assert g.node not in job.excluded_nodes
            for i in g.gpus:
                assert n.gpus[i].healthy
                assert (g.node, i) not in taken, "GPU double-booked"
                taken.add((g.node, i))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_gangs_are_all_or_nothing(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    jobs = {j.job_id: j for j in pending}
    decided = [s.job_id for s in plan.starts] + [w.job_id for w in plan.waits]
    assert sorted(decided) == sorted(jobs), "every job starts or waits, exactly once"
    for s in plan.starts:
        job = jobs[s.job_id]
        assert len({g.node for g in s.grants}) == len(s.grants)
        if job.exclusive:  # whole nodes: every GPU on them
            assert sum(len(g.gpus) for g in s.grants) >= (job.gpus_total or 0)
            assert all(len(g.gpus) >= job.gpus_per_node for g in s.grants)
        elif job.gpus_total is not None:
            assert sum(len(g.gpus) for g in s.grants) == job.gpus_total
        else:
            assert job.nodes_min <= len(s.grants) <= job.nodes_max
            assert all(len(g.gpus) == job.gpus_per_node for g in s.grants)


@settings(max_examples=200, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_same_input_same_plan_whatever_the_queue_order(
    world: tuple[Snapshot, list[JobRequest]], rnd: random.Random
) -> None:
    snap, pending = world
    shuffled = list(pending)
    rnd.shuffle(shuffled)
    assert place(snap, pending, now=T0) == place(snap, shuffled, now=T0)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_preemption_goes_strictly_down_tiers(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    running = {r.job_id: r for r in snap.running}
    jobs = {j.job_id: j for j in pending}
    victims = [p.victim_job_id for p in plan.preemptions]
    assert len(victims) == len(set(victims)), "a victim is preempted once"
    for p in plan.preemptions:
        victim, preemptor = running[p.victim_job_id], jobs[p.for_job_id]
        assert preemptor.can_preempt and victim.preemptible
        assert victim.tier < preemptor.tier, "equal or higher tiers are never preempted"
        assert T0 - victim.started_at >= victim.min_runtime_s
        waits = {w.job_id: w.reason for w in plan.waits}
        assert waits[p.for_job_id] is Waiting.PREEMPTING


def _after(snap: Snapshot, plan: Plan, pending: list[JobRequest], at: float) -> Snapshot:
    """The cluster at `at` if every job runs to its time limit."""
    jobs = {j.job_id: j for j in pending}
    started = [
        Running(
            job_id=s.job_id,
            user="x",
            account="x",
            started_at=T0,
            time_limit_s=jobs[s.job_id].time_limit_s,
            grants=s.grants,
        )
        for s in plan.starts
    ]
    alive = [r for r in (*snap.running, *started) if r.started_at + r.time_limit_s > at]
    return Snapshot(nodes=snap.nodes, running=tuple(alive))


@settings(max_examples=300, deadline=None)
@given(worlds(extras=False))
def test_backfill_never_delays_the_reserved_job(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    top = next((w for w in plan.waits if w.reason is Waiting.RESOURCES), None)
    if top is None or top.estimated_start is None:
        return
    job = next(j for j in pending if j.job_id == top.job_id)
    later = _after(snap, plan, pending, top.estimated_start)
    replay = place(later, [job], now=top.estimated_start)
    assert [s.job_id for s in replay.starts] == [job.job_id], "backfill pushed it back"


@settings(max_examples=100, deadline=None)
@given(worlds())
def test_waits_follow_the_queue_order(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    rank = {j.job_id: rank_key(j, T0, PolicyConfig()) for j in pending}
    assert [w.job_id for w in plan.waits] == sorted(
        (w.job_id for w in plan.waits), key=lambda j: rank[j]
    )
