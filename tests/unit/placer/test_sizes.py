"""Table test: a job goes only to nodes with the CPUs and memory it asks of each
(core/sizes.py), whichever way the placer chooses them: a start, a wait for the big
nodes, a job no node is big enough for, spares after a fault."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core import Node, Waiting, place
from services.placer.core.spares import place_spares
from services.placer.repo.allocations import LiveAllocation
from services.placer.service import _spare_gang
from shared.events import JobSparesRequested
from shared.jobspec import JobSpec
from tests.unit.placer.helpers import T0, gang, node, running, snapshot, whole

GIB = 1024


def sized(name: str, cpus: int, gib: int, topology: tuple[str, ...] = ()) -> Node:
    return msgspec.structs.replace(
        node(name, 8, topology=topology), cpus=cpus, memory_mib=gib * GIB
    )


SMALL, BIG, UNKNOWN = sized("a-small", 16, 64), sized("b-big", 96, 1024), node("c-unknown", 8)

CASES = {
    "a job asking nothing of size takes the first node": (
        (SMALL, BIG), (), gang(1, 1, 8), "a-small",
    ),
    "--mem more than the small node has: the big one": (
        (SMALL, BIG), (), gang(1, 1, 8, mem_per_node_mib=100 * GIB), "b-big",
    ),
    "CPUs more than the small node has: the big one": (
        (SMALL, BIG), (), gang(1, 1, 8, cpus_per_node=32), "b-big",
    ),
    "a node whose size is not known fits": (
        (SMALL, UNKNOWN), (), gang(1, 1, 8, mem_per_node_mib=100 * GIB), "c-unknown",
    ),
    "the big node busy: it waits for it, the small node left idle": (
        (SMALL, BIG), (running(9, whole("b-big")),), gang(1, 1, 8, mem_per_node_mib=100 * GIB),
        Waiting.RESOURCES,
    ),
    "no node of the partition is big enough: it can never run as asked": (
        (SMALL, BIG), (), gang(1, 2, 8, mem_per_node_mib=100 * GIB), Waiting.BAD_CONSTRAINTS,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("nodes", "runs", "job", "want"), CASES.values(), ids=CASES.keys())
def test_a_job_goes_only_to_nodes_big_enough_for_it(
    nodes: tuple[Node, ...], runs: tuple[object, ...], job: object, want: str | Waiting
) -> None:
    plan = place(snapshot(*nodes, running=runs), [job], now=T0)  # type: ignore[arg-type, list-item]
    if isinstance(want, Waiting):
        assert [w.reason for w in plan.waits] == [want], plan
    else:
        assert [g.node for s in plan.starts for g in s.grants] == [want], plan


def test_a_job_no_node_is_big_enough_for_says_what_it_asks() -> None:
    plan = place(snapshot(SMALL, BIG), [gang(1, 2, 8, mem_per_node_mib=100 * GIB)], now=T0)
    assert plan.waits[0].detail == (
        "1 node(s) of partition normal have 1 CPUs and 102400 MiB per node"
    )


def test_spares_are_big_enough_too() -> None:
    """A job that lost a node gets a spare with its memory, not the nearest small one."""
    nodes = (
        sized("kept", 96, 1024, ("leaf0",)),
        sized("near-small", 16, 64, ("leaf0",)),
        sized("far-big", 96, 1024, ("leaf1",)),
    )
    job = gang(1, 1, 8, mem_per_node_mib=100 * GIB, excluded_nodes=("kept",))
    snap = snapshot(*nodes, running=(running(1, whole("kept")),))
    start = place_spares(snap, job, ("kept",), T0)
    assert start is not None and [g.node for g in start.grants] == ["far-big"]


def test_the_spares_asked_for_a_job_carry_its_size() -> None:
    """The placer's request for a job's spares (placer/service.py) asks each spare the
    job's CPUs and memory per node, so `place_spares` above gets them."""
    spec = JobSpec(
        user="ada", script="#!/bin/sh\n", gpus_per_node=8, cpus_per_task=6,
        ntasks_per_node=4, mem_mib=100 * GIB,
    )  # fmt: skip
    alloc = LiveAllocation(alloc_id=1, attempt=0, nodes=("kept", "lost"), spec=spec)
    ask = JobSparesRequested(job_id=1, attempt=0, count=1, keep=("kept",))
    gang = _spare_gang(ask, alloc)
    assert (gang.cpus_per_node, gang.mem_per_node_mib) == (24, 100 * GIB)
