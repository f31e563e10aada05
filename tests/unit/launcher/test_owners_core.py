"""Table tests: how launcher replicas share the shards of the jobs."""

from __future__ import annotations

import pytest

from services.launcher.owners_core import SHARDS, ShardPlan, plan_shards, shard_of

EMPTY: frozenset[int] = frozenset()
CASES = [
    ("alone, holding nothing: take every shard", EMPTY, 1, EMPTY, ShardPlan(take=32, release=())),
    (
        "alone and holding all: nothing to do",
        frozenset(range(32)), 1, EMPTY, ShardPlan(take=0, release=()),
    ),
    (
        "a second replica appeared: let go of the odd shards (an array spans both)",
        frozenset(range(32)), 2, EMPTY, ShardPlan(take=0, release=tuple(range(1, 32, 2))),
    ),
    (
        "a second replica appeared, but some shards are busy: keep those, release others",
        frozenset(range(32)), 2, frozenset({31, 29}),
        ShardPlan(take=0, release=(*range(1, 29, 2), 28, 30)),
    ),
    (
        "every held shard is busy: release nothing yet",
        frozenset(range(32)), 2, frozenset(range(32)), ShardPlan(take=0, release=()),
    ),
    (
        "the other replica died: take its half",
        frozenset(range(16)), 1, EMPTY, ShardPlan(take=16, release=()),
    ),
    (
        "three replicas: the share rounds up",
        frozenset(range(5)), 3, EMPTY, ShardPlan(take=6, release=()),
    ),
    (
        "no replica counted (a stale view): as if alone",
        EMPTY, 0, EMPTY, ShardPlan(take=32, release=()),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "held", "replicas", "busy", "want"), CASES, ids=[c[0] for c in CASES]
)
def test_plan_shards(
    name: str, held: frozenset[int], replicas: int, busy: frozenset[int], want: ShardPlan
) -> None:
    assert plan_shards(held, replicas, busy) == want


def test_every_job_has_one_shard_in_range() -> None:
    assert {shard_of(j) for j in range(1, 1000)} == set(range(SHARDS))
