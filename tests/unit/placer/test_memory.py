"""Table test: a node's memory is counted out as jobs hold it (core/memory.py). A job
starts only where its --mem fits beside what running jobs, and those started before it
in the pass, hold; a preemptor stops the jobs holding the memory it needs, or nobody."""

from __future__ import annotations

import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.placer.core import (
    JobRequest,
    Node,
    PolicyConfig,
    Running,
    Snapshot,
    Waiting,
    place,
    prepare,
)
from services.placer.core.place import Prepared
from tests.unit.placer.helpers import T0, gang, grant, node, running, snapshot

GIB = 1024


def sized(name: str, gib: int) -> Node:
    return msgspec.structs.replace(node(name, 8), cpus=64, memory_mib=gib * GIB)


def holds(
    job_id: int, where: str, gib: int, gpus: tuple[int, ...] = (0, 1, 2, 3), **kw: object
) -> Running:
    return running(job_id, grant(where, *gpus), mem_per_node_mib=gib * GIB, **kw)


def asks(job_id: int, gib: int, nodes: int = 1, gpus: int = 4, **kw: object) -> JobRequest:
    return gang(job_id, nodes, gpus, mem_per_node_mib=gib * GIB, **kw)


A, B, C = sized("a", 128), sized("b", 128), sized("c", 128)
UNKNOWN = node("u", 8)  # memory not announced: never short

CASES = {
    "memory held beside free GPUs: the other node": (
        (A, B), (holds(9, "a", 100),), (asks(1, 64),), {1: ("b",)},
    ),
    "memory held on the only node: it waits": (
        (A,), (holds(9, "a", 100),), (asks(1, 64),), {},
    ),
    "what is left fits: the same node": (
        (A,), (holds(9, "a", 64),), (asks(1, 64),), {1: ("a",)},
    ),
    "a job asking no memory holds none and needs none": (
        (A,), (holds(9, "a", 0),), (asks(1, 120),), {1: ("a",)},
    ),
    "a job without --mem starts beside a memory hog": (
        (A,), (holds(9, "a", 128),), (gang(1, 1, 4),), {1: ("a",)},
    ),
    "two jobs of one pass: the second counts the first's": (
        (A,), (), (asks(1, 100), asks(2, 100)), {1: ("a",)},
    ),
    "two jobs of one pass, two nodes: one each": (
        (A, B), (), (asks(1, 100, gpus=2), asks(2, 100, gpus=2)), {1: ("a",), 2: ("b",)},
    ),
    "a gang leaves the node whose memory is held": (
        (A, B, C), (holds(9, "a", 100),), (asks(1, 64, nodes=2),), {1: ("b", "c")},
    ),
    "a node whose memory is not known is never short": (
        (UNKNOWN,), (holds(9, "u", 100),), (asks(1, 100),), {1: ("u",)},
    ),
    "--mem=0 wants all of a node's memory: the node nothing holds any of": (
        (A, B), (holds(9, "a", 1),), (asks(1, 0, mem_whole=True),), {1: ("b",)},
    ),
    "--mem=0 running holds all of it: a job asking any waits": (
        (A,), (holds(9, "a", 0, mem_whole=True),), (asks(1, 1),), {},
    ),
    "--mem=0 beside a job asking none: it starts": (
        (A,), (holds(9, "a", 0),), (asks(1, 0, mem_whole=True),), {1: ("a",)},
    ),
    "--mem=0 in one pass: the second waits": (
        (A,), (), (asks(1, 0, gpus=2, mem_whole=True), asks(2, 0, gpus=2, mem_whole=True)),
        {1: ("a",)},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("nodes", "runs", "jobs", "want"), CASES.values(), ids=CASES.keys())
def test_a_job_starts_only_where_its_memory_is_free(
    nodes: tuple[Node, ...],
    runs: tuple[Running, ...],
    jobs: tuple[JobRequest, ...],
    want: dict[int, tuple[str, ...]],
) -> None:
    plan = place(snapshot(*nodes, running=runs), list(jobs), now=T0)
    got = {s.job_id: tuple(sorted(g.node for g in s.grants)) for s in plan.starts}
    assert got == want, plan
    assert {w.job_id for w in plan.waits} == {j.job_id for j in jobs} - set(want)


def test_a_wait_for_memory_names_the_nodes_short_of_it() -> None:
    plan = place(snapshot(A, running=(holds(9, "a", 100),)), [asks(1, 64)], now=T0)
    (wait,) = plan.waits
    assert wait.reason == Waiting.RESOURCES
    assert wait.detail == "not enough free GPUs, or 65536 MiB of free memory on a"


def test_a_wait_for_all_of_a_nodes_memory_says_so() -> None:
    plan = place(snapshot(A, running=(holds(9, "a", 1),)), [asks(1, 0, mem_whole=True)], now=T0)
    assert plan.waits[0].detail == "not enough free GPUs, or all of its memory on a"


def test_a_wait_for_gpus_alone_says_nothing_of_memory() -> None:
    full = running(9, grant("a", *range(8)))
    plan = place(snapshot(A, running=(full,)), [asks(1, 64)], now=T0)
    assert [(w.reason, w.detail) for w in plan.waits] == [(Waiting.RESOURCES, "")]


LOW = {"tier": 0, "preemptible": True}
URGENT = {"tier": 1, "can_preempt": True}

PREEMPTS = {
    "the job holding the memory goes, though its GPUs are not needed": (
        (A,),
        (holds(8, "a", 0, (0, 1, 2, 3), **LOW), holds(9, "a", 100, (4, 5), **LOW, priority=5)),
        asks(1, 64, gpus=4, **URGENT),
        [8, 9],  # 8 is cheaper and frees the GPUs; 9 holds the memory
    ),
    "memory held by a job it may not preempt: nobody is stopped": (
        (A,),
        (holds(8, "a", 0, (0, 1, 2, 3), **LOW), holds(9, "a", 100, (4, 5), tier=1)),
        asks(1, 64, gpus=4, **URGENT),
        [],
    ),
    "--mem=0: every candidate holding memory on the node goes": (
        (A,),
        (holds(8, "a", 0, (0, 1, 2, 3), **LOW), holds(9, "a", 10, (4, 5), **LOW, priority=5)),
        asks(1, 0, gpus=4, mem_whole=True, **URGENT),
        [8, 9],
    ),
    "the node whose memory it cannot get is left for one it can": (
        (A, B),
        (
            holds(7, "a", 100, (4, 5), tier=1),
            holds(8, "a", 0, (0, 1, 2, 3), **LOW),
            holds(6, "b", 0, tuple(range(8)), **LOW),
        ),
        asks(1, 64, gpus=4, **URGENT),
        [6],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("nodes", "runs", "job", "want"), PREEMPTS.values(), ids=PREEMPTS.keys())
def test_a_preemptor_stops_the_jobs_holding_its_memory_or_none(
    nodes: tuple[Node, ...], runs: tuple[Running, ...], job: JobRequest, want: list[int]
) -> None:
    plan = place(snapshot(*nodes, running=runs), [job], now=T0)
    assert sorted(p.victim_job_id for p in plan.preemptions) == want, plan
    assert not plan.starts


@st.composite
def memory_worlds(draw: st.DrawFn) -> tuple[Snapshot, list[JobRequest]]:
    """Nodes of known memory, running jobs holding some of it (within it), and a queue
    asking memory (some `--mem=0`), none, or GPUs alone."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    nodes = [sized(f"n{i}", rng.choice([64, 128, 256])) for i in range(rng.randint(1, 6))]
    held = {n.name: 0 for n in nodes}
    running = []
    for j in range(rng.randint(0, 4)):  # GPUs 2j, 2j+1: none taken twice
        n = rng.choice(nodes)
        gib = rng.choice([0, 16, 32, 64])
        if held[n.name] + gib * GIB > n.memory_mib:
            continue
        held[n.name] += gib * GIB
        running.append(holds(100 + j, n.name, gib, (2 * j, 2 * j + 1)))
    pending = []
    for j in range(1, rng.randint(2, 10)):
        whole = rng.random() < 0.15
        gib = 0 if whole else rng.choice([0, 8, 32, 64, 100])
        pending.append(
            asks(j, gib, nodes=rng.choice([1, 1, 2]), gpus=rng.choice([1, 2, 4]), mem_whole=whole)
        )
    return snapshot(*nodes, running=tuple(running)), pending


@settings(max_examples=300, deadline=None)
@given(memory_worlds())
def test_no_start_takes_a_node_past_its_memory(world: tuple[Snapshot, list[JobRequest]]) -> None:
    snap, pending = world
    plan = place(snap, pending, now=T0)
    cap = {n.name: n.memory_mib for n in snap.nodes}
    used = dict.fromkeys(cap, 0)
    for r in snap.running:
        for g in r.grants:
            used[g.node] += r.mem_per_node_mib
    by_id = {j.job_id: j for j in pending}
    for s in plan.starts:
        job = by_id[s.job_id]
        for g in s.grants:
            used[g.node] += cap[g.node] if job.mem_whole else job.mem_per_node_mib
    assert all(used[n] <= cap[n] for n in cap), (used, plan)


BINDS = {
    "memory by GPU (def_mem_per_gpu): free memory is the free GPUs' share": (
        (holds(9, "a", 64),), 4, 64, False,
    ),
    "more held than the GPUs' share: a job of that share may find a node short": (
        (holds(9, "a", 100),), 4, 64, True,
    ),
    "a smaller ask per GPU than any node's free memory per GPU": (
        (holds(9, "a", 100),), 4, 28, False,
    ),
    "nothing held anywhere": ((), 4, 100, False),
    "no GPUs asked: any node short of it binds": ((holds(9, "a", 100),), 0, 64, True),
    "--mem=0 beside held memory": ((holds(9, "a", 1),), 4, -1, True),
}  # fmt: skip


@pytest.mark.parametrize(("runs", "g", "ask", "want"), BINDS.values(), ids=BINDS.keys())
def test_memory_binds_a_job_only_where_it_may_keep_it_off_a_node(
    runs: tuple[Running, ...], g: int, ask: int, want: bool
) -> None:
    """`binds` (O(1), what lets most jobs take the fast paths) is False only where no
    node with the job's GPUs free lacks its memory: 128 GiB nodes of 8 GPUs, GPUs 0-3
    held by the running job."""
    memory = prepare(snapshot(A, B, running=runs), now=T0).memory
    assert memory.binds(ask * GIB if ask > 0 else ask, g) is want
    if not want:
        assert not memory.out(ask * GIB if ask > 0 else ask, g)


@settings(max_examples=200, deadline=None)
@given(memory_worlds(), st.booleans())
def test_the_no_room_memo_gives_the_plan_the_full_search_gives(
    world: tuple[Snapshot, list[JobRequest]], book: bool
) -> None:
    """`Prepared._memo` answers a memory-bound job as the last of its shape was answered
    while nothing was taken since: the plan is the one searching every job gives (with
    bookings, and without: then nothing is taken between waits and the memo answers)."""
    snap, pending = world
    pending = [  # each job twice in a row: the second finds the first's memo
        msgspec.structs.replace(
            j, job_id=2 * j.job_id + k, submitted_at=T0 - 1000 + 2 * j.job_id + k
        )
        for j in pending
        for k in (0, 1)
    ]
    config = PolicyConfig(backfill=book, preemption=book)
    memo = place(snap, pending, now=T0, config=config)
    assert memo == place_unmemoized(snap, pending, config)


def place_unmemoized(snap: Snapshot, pending: list[JobRequest], config: PolicyConfig) -> object:
    original = Prepared._memo
    Prepared._memo = lambda *_: None  # type: ignore[method-assign]
    try:
        return place(snap, pending, now=T0, config=config)
    finally:
        Prepared._memo = original  # type: ignore[method-assign]


def test_a_memory_bound_shape_found_without_room_is_searched_once() -> None:
    """Node a has its GPUs free but not the memory, b no GPUs free: the first of two
    alike jobs searches node by node; the second takes its answer (`_memo`)."""
    runs = (holds(9, "a", 100), running(8, grant("b", *range(8))))
    prep = prepare(snapshot(A, B, running=runs), now=T0, config=PolicyConfig(backfill=False))
    searched: list[int] = []
    search = prep._select

    def counted(job: JobRequest, *rest: object) -> object:
        searched.append(job.job_id)
        return search(job, *rest)  # type: ignore[arg-type]

    prep._select = counted  # type: ignore[method-assign, assignment]
    plan = prep.plan([asks(1, 64), asks(2, 64)])
    assert [w.job_id for w in plan.waits] == [1, 2] and not plan.starts, plan
    assert searched == [1]
