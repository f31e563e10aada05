"""Property tests (hypothesis): every start meets its job's `--constraint` as a whole.

On random small clusters whose nodes carry random features, with running jobs in the
way, every job started has on every node the uncounted features of one alternative (the
same one for all nodes of a matching OR or an OR with counts), each counted feature on
nodes of its own, and no GPU is given twice; a job is called unsatisfiable
(BAD_CONSTRAINTS) only when no set of the cluster's nodes would do.
"""

from __future__ import annotations

import random
from itertools import combinations, permutations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import JobRequest, Node, Running, Snapshot, Waiting, place
from shared.constraint import Constraint, parse
from tests.unit.placer.helpers import T0, gang, node, running, whole

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
        for j in range(1, rng.randint(2, 6))
    ]
    return Snapshot(nodes=tuple(nodes), running=jobs_running), jobs


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
        sizes = range(job.nodes_min, min(job.nodes_max, len(features)) + 1)
        assert not any(
            satisfied(c, [features[i] for i in chosen])
            for k in sizes
            for chosen in combinations(range(len(features)), k)
        ), (job.constraint, w.detail)
