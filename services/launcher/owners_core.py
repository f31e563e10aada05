"""Pure: how launcher replicas share the jobs' shards (owners.py applies it).

A job belongs to shard `job_id % SHARDS`; a replica holds a shard by a lease row. Each
pass, a replica keeps what it holds up to its fair share (the shards over the replicas
seen lately, rounded up), takes free or expired shards up to that share, and lets go
of the excess (odd shards first), but never of a shard one of whose jobs it is still
acting on (the new owner would find its work half done).
"""

from __future__ import annotations

import msgspec

SHARDS = 32  # as launcher_shard() in shared/migrations/0013_launcher_owners.sql


def shard_of(job_id: int) -> int:
    return job_id % SHARDS


class ShardPlan(msgspec.Struct, frozen=True, kw_only=True):
    take: int  # how many free or expired shards to take
    release: tuple[int, ...]  # held shards to let go of now


def plan_shards(
    held: frozenset[int], replicas: int, busy: frozenset[int], shards: int = SHARDS
) -> ShardPlan:
    """`held`: the shards this replica renewed; `replicas`: live replicas, this one
    included; `busy`: shards with a job this replica is acting on."""
    share = -(-shards // max(1, replicas))
    if len(held) <= share:
        return ShardPlan(take=share - len(held), release=())
    # Odd shards first: consecutive job ids (an array) then land on both replicas.
    idle = sorted((s for s in held if s not in busy), key=lambda s: (s % 2 == 0, -s))
    return ShardPlan(take=0, release=tuple(sorted(idle[: len(held) - share])))
