"""A node a fabric fault keeps out of multi-node jobs (health's `exclude_multi_node`:
errors rising, speed degraded) stays UP for single-node work, and no job that spans
nodes gets it: gangs, elastic jobs, GPU totals wider than a node, spares and growth."""

from __future__ import annotations

from random import Random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import JobRequest, Node, Plan, Snapshot, place, place_spares
from tests.unit.placer.helpers import T0, gang, grant, node, running, snapshot
from tests.unit.placer.test_properties import worlds

DEGRADED = "mlx5_0/1 speed_degraded (100 of 200 Gb/s)"


def flagged(n: Node) -> Node:
    return msgspec.structs.replace(n, multi_node_excluded=DEGRADED)


def summary(plan: Plan) -> tuple[tuple[object, ...], ...]:
    """Each job's outcome: the nodes it starts on, or its wait reason and detail."""
    starts = [(s.job_id, tuple(g.node for g in s.grants)) for s in plan.starts]
    waits = [(w.job_id, str(w.reason), w.detail) for w in plan.waits]
    return tuple(sorted((*starts, *waits), key=lambda t: int(str(t[0]))))


ABC = (flagged(node("a", 4)), node("b", 4), node("c", 4))
WHY = f"kept out of multi-node jobs by fabric faults: a ({DEGRADED})"

CASES: dict[str, tuple[Snapshot, list[JobRequest], tuple[tuple[object, ...], ...]]] = {
    "a two-node gang leaves the flagged node out, though it comes first": (
        snapshot(*ABC),
        [gang(1, 2, gpus_per_node=4)],
        ((1, ("b", "c")),),
    ),
    "a one-node job may use the flagged node: it is UP for single-node work": (
        snapshot(*ABC, running=(running(9, grant("b", 0, 1, 2, 3), grant("c", 0, 1, 2, 3)),)),
        [gang(1, 1, gpus_per_node=4)],
        ((1, ("a",)),),
    ),
    "an elastic job that may grow past one node spans nodes: not on the flagged one": (
        snapshot(*ABC),
        [gang(1, (1, 3), gpus_per_node=4)],
        ((1, ("b", "c")),),
    ),
    "a GPU total wider than one node spans nodes: not on the flagged one": (
        snapshot(*ABC),
        [gang(1, 1, gpus_total=8)],
        ((1, ("b", "c")),),
    ),
    "a GPU total one node holds may land on the flagged node": (
        snapshot(*ABC, running=(running(9, grant("b", 0, 1, 2, 3), grant("c", 0, 1, 2, 3)),)),
        [gang(1, 1, gpus_total=4)],
        ((1, ("a",)),),
    ),
    "too few sound nodes: the gang waits for the links, naming them, not as impossible": (
        snapshot(flagged(node("a", 4)), node("b", 4)),
        [gang(1, 2, gpus_per_node=4)],
        ((1, "NODES_EXCLUDED", WHY),),
    ),
    "a gang that requires the flagged node waits for its link": (
        snapshot(*ABC),
        [gang(1, 2, gpus_per_node=4, required_nodes=("a", "b"))],
        ((1, "NODES_EXCLUDED", WHY),),
    ),
    "enough sound nodes, only busy: the gang waits for room as ever": (
        snapshot(*ABC, running=(running(9, grant("b", 0)),)),
        [gang(1, 2, gpus_per_node=4)],
        ((1, "RESOURCES", ""),),
    ),
    "with no flag, the gang takes the first nodes": (
        snapshot(node("a", 4), node("b", 4), node("c", 4)),
        [gang(1, 2, gpus_per_node=4)],
        ((1, ("a", "b")),),
    ),
    "the gang and a one-node job in one pass: each where the rule lets it": (
        snapshot(*ABC),
        [gang(1, 2, gpus_per_node=4), gang(2, 1, gpus_per_node=4)],
        ((1, ("b", "c")), (2, ("a",))),
    ),
}


@pytest.mark.parametrize(("snap", "pending", "want"), CASES.values(), ids=CASES.keys())
def test_fabric_exclusion(
    snap: Snapshot, pending: list[JobRequest], want: tuple[tuple[object, ...], ...]
) -> None:
    plan = place(snap, pending, T0)
    assert summary(plan) == want
    assert place(snap, pending, T0) == plan  # same input, same plan


SPARES = {
    "a spare joins the nodes kept: the flagged node is passed over for a sound one": (
        (flagged(node("a", 4)), node("b", 4), node("c", 4), node("d", 4)),
        ("d",),
    ),
    "only the flagged node free: no spare (the job is requeued instead)": (
        (flagged(node("a", 4)), node("b", 4), node("c", 4)),
        None,
    ),
}


@pytest.mark.parametrize(("nodes", "want"), SPARES.values(), ids=SPARES.keys())
def test_spares_and_growth_never_take_a_flagged_node(
    nodes: tuple[Node, ...], want: tuple[str, ...] | None
) -> None:
    # Job 1 ran on b and c; c failed; it keeps b and asks for one more (the shape of a
    # grow-back ask too: keep the running nodes, `count` more).
    snap = snapshot(*nodes, running=(running(1, grant("b", 0, 1, 2, 3)),))
    job = gang(1, 1, gpus_per_node=4, excluded_nodes=("b", "c"))
    start = place_spares(snap, job, near=("b",), now=T0)
    assert (None if start is None else tuple(g.node for g in start.grants)) == want


def test_a_lone_one_node_request_with_nothing_kept_may_take_the_flagged_node() -> None:
    snap = snapshot(flagged(node("a", 4)))
    start = place_spares(snap, gang(1, 1, gpus_per_node=4), near=(), now=T0)
    assert start is not None and [g.node for g in start.grants] == ["a"]


@settings(max_examples=200, deadline=None)
@given(worlds(), st.randoms(use_true_random=False))
def test_no_start_of_several_nodes_ever_includes_a_flagged_node(
    world: tuple[Snapshot, list[JobRequest]], rng: Random
) -> None:
    snap, pending = world
    marked = {n.name for n in snap.nodes if rng.random() < 0.3}
    nodes = tuple(flagged(n) if n.name in marked else n for n in snap.nodes)
    plan = place(msgspec.structs.replace(snap, nodes=nodes), pending, T0)
    by_id = {j.job_id: j for j in pending}
    for s in plan.starts:
        names = {g.node for g in s.grants}
        if len(names) > 1 or by_id[s.job_id].nodes_max > 1:
            assert not names & marked, (s, marked)
