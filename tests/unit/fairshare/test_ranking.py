"""Table tests of `ranking.rank`: the priority of every pending job in one pass, from
frozen facts (pending jobs, decayed usage, the policy) at an injected `now`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from services.fairshare.priority import PriorityBreakdown, PriorityFactors, PriorityWeights
from services.fairshare.ranking import PendingJob, RankPolicy, rank
from services.fairshare.tree import Assoc
from shared.jobspec import JobSpec
from tests.unit.fairshare.builders import acct, tree, used, user

NOW = 1_800_000_000.0
TREE = tree(
    acct("research", 70),
    acct("prod", 30),
    user("alice", "research"),
    user("bob", "research"),
    user("dave", "prod"),
)
HEAVY_RESEARCH = used(alice__research=1000.0, bob__research=5.0, dave__prod=10.0)
FAIRSHARE_ONLY = RankPolicy(tree=TREE, weights=PriorityWeights(fairshare=10000))


def job(job_id: int, user: str = "alice", account: str = "research", **kw: Any) -> PendingJob:
    submitted = kw.pop("submitted_at", NOW)
    spec = JobSpec(user=user, account=account, script="#!/bin/sh\n", **kw)
    return PendingJob(job_id=job_id, spec=spec, submitted_at=submitted)


def share(fs: float) -> PriorityBreakdown:
    """The breakdown of a job priced on fair share alone (weight 10000)."""
    return PriorityBreakdown(
        total=10000 * fs, fairshare=10000 * fs, factors=PriorityFactors(fairshare=fs)
    )


# With no usage and no tree, each job's user is alone at the top: fair-share factor 1.0,
# which a fair-share weight of 0 leaves out of the total.

CASES: dict[str, tuple[list[PendingJob], Mapping[Assoc, float], RankPolicy, dict[int, Any]]] = {
    "the user of the account furthest under its share ranks first": (
        [job(1), job(2, "dave", "prod")],
        used(alice__research=1000.0, dave__prod=10.0),
        RankPolicy(
            tree=tree(
                acct("research", 70),
                acct("prod", 30),
                user("alice", "research"),
                user("dave", "prod"),
            ),
            weights=PriorityWeights(fairshare=10000),
        ),
        {1: share(0.5), 2: share(1.0)},
    ),
    "a newcomer outranks everyone, and everyone is ranked out of N with it": (
        [job(1), job(2, "dave", "prod"), job(3, "zoe", "startup")],
        HEAVY_RESEARCH,
        FAIRSHARE_ONLY,
        {1: share(0.25), 2: share(0.75), 3: share(1.0)},
    ),
    "age counts from a later --begin, and a begin still ahead gives no age": (
        [
            job(1, submitted_at=NOW - 500),
            job(2, submitted_at=NOW - 500, begin_at=NOW - 100),
            job(3, submitted_at=NOW - 500, begin_at=NOW + 100),
        ],
        {},
        RankPolicy(weights=PriorityWeights(age=1000, max_age_s=1000)),
        {
            1: PriorityBreakdown(
                total=500.0, age=500.0, factors=PriorityFactors(fairshare=1.0, age=0.5)
            ),
            2: PriorityBreakdown(
                total=100.0, age=100.0, factors=PriorityFactors(fairshare=1.0, age=0.1)
            ),
            3: PriorityBreakdown(total=0.0, factors=PriorityFactors(fairshare=1.0)),
        },
    ),
    "size is GPUs over the cluster's, and nice lowers the total but never below 0": (
        [
            job(1, nodes_min=2, nodes_max=2, gpus_per_node=8),
            job(2, nodes_min=2, nodes_max=2, gpus_per_node=8, nice=100),
            job(3, gpus_per_node=8, nice=1000),
        ],
        {},
        RankPolicy(weights=PriorityWeights(jobsize=1000), cluster_gpus=64),
        {
            1: PriorityBreakdown(
                total=250.0, jobsize=250.0, factors=PriorityFactors(fairshare=1.0, jobsize=0.25)
            ),
            2: PriorityBreakdown(
                total=150.0,
                jobsize=250.0,
                nice=100,
                factors=PriorityFactors(fairshare=1.0, jobsize=0.25),
            ),
            3: PriorityBreakdown(
                total=0.0,
                jobsize=125.0,
                nice=1000,
                factors=PriorityFactors(fairshare=1.0, jobsize=0.125),
            ),
        },
    ),
    "partition and QOS count relative to the highest configured, unknown ones as 0": (
        [job(1, partition="urgent", qos="high"), job(2, partition="normal", qos="odd")],
        {},
        RankPolicy(
            weights=PriorityWeights(
                partition=1000,
                qos=2000,
                partition_priorities={"normal": 1, "urgent": 4},
                qos_priorities={"high": 10, "low": 5},
            )
        ),
        {
            1: PriorityBreakdown(
                total=3000.0,
                partition=1000.0,
                qos=2000.0,
                factors=PriorityFactors(fairshare=1.0, partition=1.0, qos=1.0),
            ),
            2: PriorityBreakdown(
                total=250.0, partition=250.0, factors=PriorityFactors(fairshare=1.0, partition=0.25)
            ),
        },
    ),
    "nothing pending prices nothing": ([], HEAVY_RESEARCH, FAIRSHARE_ONLY, {}),
}


@pytest.mark.parametrize(("pending", "usage", "policy", "want"), CASES.values(), ids=CASES.keys())
def test_rank(
    pending: list[PendingJob],
    usage: Mapping[Assoc, float],
    policy: RankPolicy,
    want: dict[int, PriorityBreakdown],
) -> None:
    assert rank(pending, usage, policy, now=NOW) == want
