"""Spares for a fixed-size job that lost a node: nearest free node first."""

from __future__ import annotations

import pytest

from services.placer.core import Grant, NodeState, Running, Snapshot, place_spares
from tests.unit.placer.helpers import T0, gang, grant, node, running

LEAF1, LEAF2, LEAF3 = ("s0", "l1"), ("s0", "l2"), ("s1", "l3")


def cluster(*extra_running: Running) -> Snapshot:
    return Snapshot(
        nodes=(
            node("a", 4, topology=LEAF1),
            node("b", 4, topology=LEAF1, state=NodeState.FAILED),
            node("c", 4, topology=LEAF1),
            node("d", 4, topology=LEAF2),
            node("e", 4, topology=LEAF3),
        ),
        running=(running(1, grant("a", 0, 1, 2, 3), grant("b", 0, 1, 2, 3)), *extra_running),
    )


CASES = {
    "a free node under the same leaf switch replaces the lost one": (
        cluster(),
        ("c",),
    ),
    "with the leaf full, the next level up (same spine) is next": (
        cluster(running(2, grant("c", 0))),
        ("d",),
    ),
    "with the spine full, any free node will do": (
        cluster(running(2, grant("c", 0)), running(3, grant("d", 0))),
        ("e",),
    ),
    "no free node: no spare, the job is requeued instead": (
        cluster(running(2, grant("c", 0)), running(3, grant("d", 0)), running(4, grant("e", 0))),
        None,
    ),
}


@pytest.mark.parametrize(("snap", "want"), CASES.values(), ids=CASES.keys())
def test_place_spares(snap: Snapshot, want: tuple[str, ...] | None) -> None:
    job = gang(1, 1, gpus_per_node=4, excluded_nodes=("a", "b"))
    start = place_spares(snap, job, near=("a",), now=T0)
    got = None if start is None else tuple(g.node for g in start.grants)
    assert got == want
    if start is not None and want is not None:
        assert start.grants == (Grant(node=want[0], gpus=(0, 1, 2, 3)),)
