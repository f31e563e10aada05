"""Table tests: `--constraint` feature counts (`a*2&b`) and ORs that must hold a job whole.

A count is met by nodes of its own (`[r1*1&r2*2]` is three nodes), the uncounted
features by every node; a matching OR (`[a|b]`) or an OR of counted alternatives tries
each alternative in turn. A job no set of nodes can satisfy waits with BAD_CONSTRAINTS
and says why; one whose counted nodes are busy waits for resources.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.placer.core import Fit, Node, Running, Waiting, place, place_spares
from shared.constraint import parse, residual
from tests.unit.placer.helpers import T0, gang, node, running, snapshot, whole


def feat(name: str, *features: str, leaf: str = "") -> Node:
    n = node(name, 4, topology=(leaf,) if leaf else ())
    return msgspec.structs.replace(n, features=features)


FLAT = (
    feat("n1", "b"),
    feat("n2", "b"),
    feat("n3", "a", "b"),
    feat("n4", "a", "b"),
    feat("n5", "a"),
    feat("r1", "rack1", "b"),
    feat("r2", "rack2", "b"),
    feat("r3", "rack2", "b"),
)

LEAVES = (
    feat("x1", "b", leaf="leaf1"),
    feat("x2", "b", leaf="leaf1"),
    feat("x3", "b", leaf="leaf1"),
    feat("y1", "a", "b", leaf="leaf2"),
    feat("y2", "a", "b", leaf="leaf2"),
    feat("y3", "b", leaf="leaf2"),
    feat("y4", "b", leaf="leaf2"),
)

Case = tuple[tuple[Node, ...], dict[str, Any], tuple[Running, ...], tuple[str, ...] | str]

# name -> (nodes, the job's request, running jobs, the nodes it starts on or why it waits)
CASES: dict[str, Case] = {
    "a count reserves the nodes with the feature, then fills from the rest": (
        FLAT,
        {"constraint": "a*2&b", "nodes": 3},
        (),
        ("n1", "n3", "n4"),
    ),
    "the uncounted feature is needed on every node": (
        FLAT[:5],
        {"constraint": "a*1&b", "nodes": 4},
        (),
        ("n1", "n2", "n3", "n4"),
    ),
    "a plain pick that already meets the count is kept": (
        FLAT,
        {"constraint": "a*1", "nodes": 3},
        (),
        ("n1", "n2", "n3"),
    ),
    "each count gets nodes of its own": (
        FLAT,
        {"constraint": "[rack1*1&rack2*2]", "nodes": 3},
        (),
        ("r1", "r2", "r3"),
    ),
    "counts are met inside one leaf switch when one can": (
        LEAVES,
        {"constraint": "a*2&b", "nodes": 3},
        (),
        ("y1", "y2", "y3"),
    ),
    "an OR of counted alternatives takes the one that can be met": (
        FLAT,
        {"constraint": "rack1*2|a*2", "nodes": 2},
        (),
        ("n3", "n4"),
    ),
    "a matching OR tries the next alternative when the first has no room for it": (
        FLAT,
        {"constraint": "[rack1|rack2]", "nodes": 2, "excluded_nodes": ("r1",)},
        (),
        ("r2", "r3"),
    ),
    "the counted nodes are busy: the job waits for resources": (
        FLAT,
        {"constraint": "a*2&b", "nodes": 2},
        (running(50, whole("n3", 4)),),
        "RESOURCES",
    ),
    "more counted nodes than the job asks for: it can never run": (
        FLAT,
        {"constraint": "a*2&b*2", "nodes": 3},
        (),
        "BAD_CONSTRAINTS: --constraint a*2&b*2 needs 4 nodes; the job asks for 3",
    ),
    "too few nodes with the feature in the partition: it can never run": (
        FLAT,
        {"constraint": "rack2*3", "nodes": 3},
        (),
        "BAD_CONSTRAINTS: no 3 node(s) of partition normal satisfy --constraint rack2*3 together",
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_feature_counts_choose_the_nodes(name: str) -> None:
    nodes, ask, busy, want = CASES[name]
    ask = dict(ask)
    n = ask.pop("nodes")
    plan = place(snapshot(*nodes, running=busy), [gang(1, nodes=n, gpus_per_node=4, **ask)], T0)
    if isinstance(want, tuple):
        assert tuple(sorted(g.node for s in plan.starts for g in s.grants)) == want
        return
    assert not plan.starts
    reason, _, detail = want.partition(": ")
    assert [(w.reason, w.detail if detail else "") for w in plan.waits] == [
        (Waiting(reason), detail)
    ]


def test_counts_inside_a_leaf_say_the_switch() -> None:
    plan = place(snapshot(*LEAVES), [gang(1, nodes=3, gpus_per_node=4, constraint="a*2&b")], T0)
    assert [(s.fit, s.domain) for s in plan.starts] == [(Fit.SWITCH, "leaf2")]


def test_an_elastic_job_grows_past_its_counted_nodes() -> None:
    plan = place(
        snapshot(*FLAT[:4]), [gang(1, nodes=(2, 4), gpus_per_node=4, constraint="a*2")], T0
    )
    assert sorted(g.node for s in plan.starts for g in s.grants) == ["n1", "n2", "n3", "n4"]


def test_a_blocked_count_job_books_the_nodes_with_the_feature_and_others_backfill() -> None:
    busy = (
        running(50, whole("n3", 4), time_limit_s=3600 + 1000),
        running(51, whole("n4", 4), time_limit_s=3600 + 2000),
    )
    jobs = [
        gang(1, nodes=2, gpus_per_node=4, constraint="a*2&b"),
        gang(2, nodes=1, gpus_per_node=4, time_limit_s=7200),
    ]
    plan = place(snapshot(*FLAT[:4], running=busy), jobs, T0)
    assert [(w.job_id, w.reason, w.estimated_start) for w in plan.waits] == [
        (1, Waiting.RESOURCES, T0 + 2000)  # when both nodes with `a` are free
    ]
    assert [(s.job_id, [g.node for g in s.grants]) for s in plan.starts] == [(2, ["n1"])]


def test_a_preemptor_with_counts_stops_the_jobs_on_the_nodes_with_the_feature() -> None:
    low = tuple(running(50 + k, whole(n.name, 4)) for k, n in enumerate(FLAT[:4]))
    job = gang(1, nodes=2, gpus_per_node=4, constraint="a*2&b", tier=1, can_preempt=True)
    plan = place(snapshot(*FLAT[:4], running=low), [job], T0)
    assert sorted(p.victim_job_id for p in plan.preemptions) == [52, 53]  # on n3 and n4
    assert [w.reason for w in plan.waits] == [Waiting.PREEMPTING]


def test_a_spare_completes_the_counts_the_kept_nodes_do_not_meet() -> None:
    nodes = (*FLAT[:3], FLAT[4], feat("n6", "a", "b"))  # n3 kept; n4 lost
    job = gang(1, nodes=1, gpus_per_node=4, constraint="a*2&b", excluded_nodes=("n3", "n4"))
    start = place_spares(snapshot(*nodes, running=(running(50, whole("n3", 4)),)), job, ("n3",), T0)
    assert start is not None
    assert [g.node for g in start.grants] == ["n6"]  # needs b, and a for the second count


@pytest.mark.parametrize(
    ("text", "kept", "want"),
    [
        ("a*2&b", [{"a", "b"}], "a*1&b"),
        ("a*2&b", [{"a", "b"}, {"a", "b"}], "b"),
        ("[r1|r2]", [{"r2"}], "r2"),
        ("[r1|r2]", [{"r1"}, {"r2"}], None),
        ("a|b", [{"a"}], "a|b"),
        ("[r1*1&r2*2]", [{"r2"}], "r1*1&r2*1"),
    ],
)
def test_residual_is_what_spares_must_meet_beside_the_kept_nodes(
    text: str, kept: list[set[str]], want: str | None
) -> None:
    assert residual(parse(text), [sorted(k) for k in kept]) == want


# A GPU total (`--gpus=N` over any nodes) steered to meet the counts, not only checked.
# name -> (nodes, the job's request, running jobs, (node, GPUs) it starts on or why it waits)
TotalCase = tuple[
    tuple[Node, ...], dict[str, Any], tuple[Running, ...], tuple[tuple[str, int], ...] | str
]
TOTAL_CASES: dict[str, TotalCase] = {
    "a GPU total whose first layout misses the count is moved to the counted nodes": (
        FLAT,
        {"gpus_total": 8, "constraint": "a*2"},
        (),
        (("n3", 4), ("n4", 4)),
    ),
    "a GPU total meets each count with nodes of its own": (
        FLAT,
        {"gpus_total": 12, "constraint": "[rack1*1&rack2*2]"},
        (),
        (("r1", 4), ("r2", 4), ("r3", 4)),
    ),
    "a total that one node could hold still spreads over the nodes its counts need": (
        FLAT,
        {"gpus_total": 4, "constraint": "a*2&b"},
        (),
        (("n3", 3), ("n4", 1)),
    ),
    "a GPU total meets its counts inside one leaf switch when one can": (
        LEAVES,
        {"gpus_total": 8, "constraint": "a*2&b"},
        (),
        (("y1", 4), ("y2", 4)),
    ),
    "a counted node is partly busy: the total takes what it has and the rest elsewhere": (
        FLAT[:5],
        {"gpus_total": 8, "constraint": "a*3"},
        (running(50, whole("n3", 3)),),
        (("n3", 1), ("n4", 4), ("n5", 3)),
    ),
    "a plain layout that meets the count is kept": (
        FLAT,
        {"gpus_total": 8, "constraint": "b*1"},
        (),
        (("n1", 4), ("n2", 4)),
    ),
    "the counted nodes are busy: the GPU total waits for resources": (
        FLAT,
        {"gpus_total": 8, "constraint": "a*2&b"},
        (running(50, whole("n3", 4)),),
        "RESOURCES",
    ),
    "a count needing more nodes than the total has GPUs: it can never run": (
        FLAT,
        {"gpus_total": 2, "constraint": "a*3"},
        (),
        "BAD_CONSTRAINTS: --constraint a*3 needs 3 nodes; --gpus=2 spreads over 2 at most",
    ),
    "a count needing more nodes than the job's node cap: it can never run": (
        FLAT,
        {"gpus_total": 8, "constraint": "[rack1*1&rack2*2]", "nodes": (1, 2)},
        (),
        "BAD_CONSTRAINTS: --constraint [rack1*1&rack2*2] needs 3 nodes; "
        "--gpus=8 spreads over 2 at most",
    ),
}


@pytest.mark.parametrize("name", TOTAL_CASES)
def test_feature_counts_steer_a_gpu_total(name: str) -> None:
    nodes, ask, busy, want = TOTAL_CASES[name]
    job = gang(1, **ask)
    plan = place(snapshot(*nodes, running=busy), [job], T0)
    if isinstance(want, tuple):
        got = tuple(sorted((g.node, len(g.gpus)) for s in plan.starts for g in s.grants))
        assert got == want
        return
    assert not plan.starts
    reason, _, detail = want.partition(": ")
    assert [(w.reason, w.detail if detail else "") for w in plan.waits] == [
        (Waiting(reason), detail)
    ]


def test_a_blocked_gpu_total_with_counts_books_the_nodes_with_the_feature() -> None:
    busy = (
        running(50, whole("n3", 4), time_limit_s=3600 + 1000),
        running(51, whole("n4", 4), time_limit_s=3600 + 2000),
    )
    jobs = [
        gang(1, gpus_total=4, constraint="a*2&b"),
        gang(2, nodes=1, gpus_per_node=4, time_limit_s=7200),
    ]
    plan = place(snapshot(*FLAT[:4], running=busy), jobs, T0)
    assert [(w.job_id, w.reason, w.estimated_start) for w in plan.waits] == [
        (1, Waiting.RESOURCES, T0 + 2000)  # when both nodes with `a` are free
    ]
    assert [(s.job_id, [g.node for g in s.grants]) for s in plan.starts] == [(2, ["n1"])]


def test_a_gpu_total_preemptor_with_counts_stops_the_jobs_on_the_counted_nodes() -> None:
    low = tuple(running(50 + k, whole(n.name, 4)) for k, n in enumerate(FLAT[:4]))
    job = gang(1, gpus_total=8, constraint="a*2&b", tier=1, can_preempt=True)
    plan = place(snapshot(*FLAT[:4], running=low), [job], T0)
    assert sorted(p.victim_job_id for p in plan.preemptions) == [52, 53]  # on n3 and n4
    assert [w.reason for w in plan.waits] == [Waiting.PREEMPTING]
