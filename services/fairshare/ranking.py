"""Pure core: the multifactor priority of every pending job in one pass.

`rank(pending, usage, policy, now)` builds the fair-share table from decayed usage,
adds every user a pending job names that the tree lacks (all newcomers first: adding one
changes everyone's rank out of N), then prices each job: its user's fair-share factor,
its age since it became eligible (submit time, or a later `--begin`), its size, its
partition and QOS, less its nice. No I/O, no clock: the shell loads the facts, passes
the `now` it read once, and writes what comes back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from services.fairshare.calculator import FairShareCalculator, job_factors_input
from services.fairshare.core import ShareOptions
from services.fairshare.priority import PriorityBreakdown, PriorityWeights, priority
from services.fairshare.tree import AccountTree, Assoc
from shared.jobspec import JobSpec


class PendingJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job waiting for an allocation, as the jobs table holds it."""

    job_id: int
    spec: JobSpec
    submitted_at: float


class RankPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What the ranking is configured with: the account tree, the fair-share algorithm,
    the priority weights and the cluster's size (for the job-size factor)."""

    tree: AccountTree = AccountTree()
    shares: ShareOptions = ShareOptions()
    weights: PriorityWeights = PriorityWeights()
    cluster_gpus: int = 0


def rank(
    pending: Sequence[PendingJob],
    usage: Mapping[Assoc, float],
    policy: RankPolicy,
    now: float,
) -> dict[int, PriorityBreakdown]:
    """Every pending job's priority at `now`, with the part each factor plays."""
    calc = FairShareCalculator(policy.tree, policy.shares)
    calc.update(by_assoc=usage)
    for job in pending:
        calc.ensure(job.spec.account, job.spec.user)
    out: dict[int, PriorityBreakdown] = {}
    for job in pending:
        fs = calc.factor(job.spec.account, job.spec.user)
        inp = job_factors_input(job.spec, fs, cluster_gpus=policy.cluster_gpus, now=now)
        eligible = max(job.submitted_at, job.spec.begin_at or 0.0)
        inp = msgspec.structs.replace(inp, eligible_at=eligible)
        out[job.job_id] = priority(inp, policy.weights, now)
    return out
