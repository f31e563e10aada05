"""Property tests (hypothesis): every start meets its job's `--constraint` as a whole.

On random small clusters whose nodes carry random features, with running jobs in the
way, every job started has on every node the uncounted features of one alternative (the
same one for all nodes of a matching OR or an OR with counts), each counted feature on
nodes of its own, and no GPU is given twice; a job is called unsatisfiable
(BAD_CONSTRAINTS) only when no set of the cluster's nodes would do. A GPU total
(`--gpus=N` over any nodes) is steered to meet its counts: alone on a cluster with jobs
in the way, it starts whenever some set of nodes' free GPUs holds it and meets its
constraint, and waits only when brute force finds none.
"""

from __future__ import annotations

import random
from itertools import combinations, permutations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import JobRequest, Node, Running, Snapshot, Waiting, place
from shared.constraint import Constraint, parse
from tests.unit.placer.helpers import T0, gang, grant, node, running, whole

FEATURES = ("a", "b", "c")
FORMS = ("a", "a&b", "a|b", "[a|b]", "a*2", "a*2&b", "a*1&c*1", "[a*2|b*2]", "a*2|c", "b&c*2")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Snapshot, list[JobRequest]]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    nodes: list[Node] = []
    for i in range(rng.randint(2, 10)):
        feats = tuple(f for f in FEATURES if rng.random() < 0.5)
        n = node(f"n{i}", 4, topology=(f"leaf{i // 3}",))
        nodes.append(msgspec.structs.replace(n, features=feats))
    busy = rng.sample(nodes, rng.randint(0, len(nodes) // 2))
    jobs_running: tuple[Running, ...] = tuple(
        running(100 + k, whole(n.name, 4)) for k, n in enumerate(busy)
    )
    jobs = [
        gang(
            j,
            nodes=rng.randint(1, 4),
            gpus_per_node=rng.choice([0, 1, 4]),
            constraint=rng.choice(FORMS),
        )
        if rng.random() < 0.6
        else gang(j, gpus_total=rng.randint(1, 12), constraint=rng.choice(FORMS))
        for j in range(1, rng.randint(2, 6))
    ]
    return Snapshot(nodes=tuple(nodes), running=jobs_running), jobs


def is_total(job: JobRequest) -> bool:
    return job.gpus_total is not None and job.gpus_per_node == 0


def sizes(job: JobRequest, n: int) -> range:
    """The node counts a job may run on, of n nodes: a GPU total one GPU a node at least."""
    if is_total(job):
        return range(1, min(job.gpus_total or 0, n) + 1)
    return range(job.nodes_min, min(job.nodes_max, n) + 1)


def satisfied(c: Constraint, features: list[set[str]]) -> bool:
    together = c.matching or any(t.count for alt in c.alternatives for t in alt)
    if not together:
        return all(
            any(all(t.feature in f for t in alt) for alt in c.alternatives) for f in features
        )
    for alt in c.alternatives:
        if not all(t.feature in f for f in features for t in alt if t.count is None):
            continue
        slots = [t.feature for t in alt for _ in range(t.count or 0)]
        nodes = range(len(features))  # some order of distinct nodes meets every slot
        if any(
            all(slot in features[i] for slot, i in zip(slots, pick, strict=True))
            for pick in permutations(nodes, len(slots))
        ):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_every_start_meets_its_constraint_and_no_gpu_is_given_twice(
    world: tuple[Snapshot, list[JobRequest]],
) -> None:
    snapshot, jobs = world
    plan = place(snapshot, jobs, T0)
    by_name = {n.name: set(n.features) for n in snapshot.nodes}
    wanted = {j.job_id: j for j in jobs}
    taken = {(g.node, i) for r in snapshot.running for g in r.grants for i in g.gpus}
    for s in plan.starts:
        job = wanted[s.job_id]
        assert job.constraint is not None
        features = [by_name[g.node] for g in s.grants]
        assert satisfied(parse(job.constraint), features), (job.constraint, s.grants)
        if is_total(job):
            assert sum(len(g.gpus) for g in s.grants) == job.gpus_total
            assert all(g.gpus for g in s.grants)
        else:
            assert job.nodes_min <= len(s.grants) <= job.nodes_max
        for g in s.grants:
            for i in g.gpus:
                assert (g.node, i) not in taken
                taken.add((g.node, i))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_a_job_is_called_unsatisfiable_only_when_no_node_set_meets_it(
    world: tuple[Snapshot, list[JobRequest]],
) -> None:
    snapshot, jobs = world
    plan = place(snapshot, jobs, T0)
    features = [set(n.features) for n in snapshot.nodes]
    wanted = {j.job_id: j for j in jobs}
    for w in plan.waits:
        job = wanted[w.job_id]
        if w.reason != Waiting.BAD_CONSTRAINTS or job.constraint is None:
            continue
        c = parse(job.constraint)
        gpus = [len(n.gpus) for n in snapshot.nodes]
        assert not any(
            satisfied(c, [features[i] for i in chosen])
            and (not is_total(job) or sum(gpus[i] for i in chosen) >= (job.gpus_total or 0))
            for k in sizes(job, len(features))
            for chosen in combinations(range(len(features)), k)
        ), (job.constraint, w.detail)


@st.composite
def lone_totals(draw: st.DrawFn) -> tuple[Snapshot, JobRequest]:
    """A cluster partly busy (whole nodes and single GPUs) and one GPU total to place."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    nodes: list[Node] = []
    for i in range(rng.randint(2, 8)):
        feats = tuple(f for f in FEATURES if rng.random() < 0.5)
        n = node(f"n{i}", 4, topology=(f"leaf{i // 3}",))
        nodes.append(msgspec.structs.replace(n, features=feats))
    busy = []
    for k, n in enumerate(rng.sample(nodes, rng.randint(0, len(nodes) - 1))):
        held = sorted(rng.sample(range(4), rng.randint(1, 4)))
        busy.append(running(100 + k, grant(n.name, *held)))
    cap = rng.choice([(1, 1), (1, 1), (2, 2), (3, 3)])  # (1, 1): any number of nodes
    job = gang(1, nodes=cap, gpus_total=rng.randint(1, 10), constraint=rng.choice(FORMS))
    return Snapshot(nodes=tuple(nodes), running=tuple(busy)), job


@settings(max_examples=400, deadline=None)
@given(lone_totals())
def test_a_gpu_total_starts_whenever_some_node_set_meets_its_counts(
    world: tuple[Snapshot, JobRequest],
) -> None:
    snapshot, job = world
    plan = place(snapshot, [job], T0)
    held = {(g.node, i) for r in snapshot.running for g in r.grants for i in g.gpus}
    free = [sum((n.name, g.index) not in held for g in n.gpus) for n in snapshot.nodes]
    features = [set(n.features) for n in snapshot.nodes]
    c = parse(job.constraint or "")
    total = job.gpus_total or 0
    cap = job.nodes_max if job.nodes_max > 1 else len(free)  # raised to what the total fills
    most = min(max(cap, -(-total // 4)), total)
    together = c.matching or any(t.count for alt in c.alternatives for t in alt)
    # each alternative of a matching OR, or one with counts, is a placement of its own;
    # a total that one node holds, with no counts to spread it, goes on one node
    asks = [
        (Constraint(alternatives=(alt,), matching=True), any(t.count for t in alt))
        for alt in (c.alternatives if together else ())
    ] or [(c, False)]

    def fits(chosen: tuple[int, ...], ask: Constraint) -> bool:
        return (
            all(free[i] for i in chosen)
            and sum(free[i] for i in chosen) >= total
            and satisfied(ask, [features[i] for i in chosen])
        )

    exists = any(
        fits(chosen, ask)
        for ask, counted in asks
        for k in range(1, (most if counted or total > 4 else 1) + 1)
        for chosen in combinations(range(len(free)), k)
    )
    assert bool(plan.starts) == exists, (job.constraint, job.gpus_total, free, plan.waits)
    for s in plan.starts:
        assert sum(len(g.gpus) for g in s.grants) == job.gpus_total
        assert len(s.grants) <= most
        assert not {(g.node, i) for g in s.grants for i in g.gpus} & held
