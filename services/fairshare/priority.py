"""Pure core: Slurm-like multifactor job priority.

    priority = w_age * age + w_fairshare * fairshare + w_jobsize * jobsize
             + w_partition * partition + w_qos * qos - nice

Every factor lies in [0, 1]:

- age: time eligible in the queue over `max_age_s`, capped at 1 (PriorityMaxAge, 7 days);
- fairshare: the user's fair-share factor (Fair Tree or classic, see `core`);
- jobsize: GPUs requested over the cluster's GPUs; with `favor_small` the smallest job
  gets 1.0 and a whole-cluster job 0.0 (PriorityFavorSmall);
- partition / qos: the priority configured for the job's partition / QOS divided by
  the highest configured one (unknown names count as 0).

The total is never below 0. The breakdown is kept per job so `muster show job` can show
why a job sits where it does, as `sprio` does.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

Weight = Annotated[int, msgspec.Meta(ge=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]

MAX_AGE_DEFAULT_S = 7 * 24 * 3600  # Slurm's PriorityMaxAge default, 7-0


class PriorityWeights(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[priority]` part of the configuration (Slurm's PriorityWeight*)."""

    age: Weight = 0
    fairshare: Weight = 0
    jobsize: Weight = 0
    partition: Weight = 0
    qos: Weight = 0
    max_age_s: Annotated[float, msgspec.Meta(gt=0)] = MAX_AGE_DEFAULT_S
    favor_small: bool = False
    partition_priorities: dict[str, int] = {}
    qos_priorities: dict[str, int] = {}


class JobFactorsInput(msgspec.Struct, frozen=True, kw_only=True):
    """What the priority of one pending job depends on, gathered by the caller."""

    eligible_at: float  # epoch seconds since when the job may run (submit or begin time)
    fairshare: Fraction  # the user's fair-share factor
    gpus: int = 0  # GPUs requested in total
    cluster_gpus: int = 0  # GPUs in the cluster (or partition); 0 = size factor 0
    partition: str = "normal"
    qos: str = "normal"
    nice: int = 0


class PriorityFactors(msgspec.Struct, frozen=True, kw_only=True):
    """The unweighted factors, each in [0, 1]."""

    age: float = 0.0
    fairshare: float = 0.0
    jobsize: float = 0.0
    partition: float = 0.0
    qos: float = 0.0


class PriorityBreakdown(msgspec.Struct, frozen=True, kw_only=True):
    """Weighted contributions (weight * factor) and their total, as `sprio` shows them."""

    total: float
    age: float = 0.0
    fairshare: float = 0.0
    jobsize: float = 0.0
    partition: float = 0.0
    qos: float = 0.0
    nice: int = 0
    factors: PriorityFactors = PriorityFactors()


def age_factor(eligible_at: float, now: float, max_age_s: float = MAX_AGE_DEFAULT_S) -> float:
    return min(max(0.0, now - eligible_at) / max_age_s, 1.0)


def jobsize_factor(gpus: int, cluster_gpus: int, *, favor_small: bool = False) -> float:
    if cluster_gpus <= 0:
        return 0.0
    if not favor_small:
        return min(max(gpus, 0) / cluster_gpus, 1.0)
    if cluster_gpus == 1:
        return 1.0
    return 1.0 - min(max(gpus, 1) - 1, cluster_gpus - 1) / (cluster_gpus - 1)


def relative_factor(name: str, priorities: dict[str, int]) -> float:
    """A partition's or QOS's priority over the highest configured one."""
    top = max(priorities.values(), default=0)
    if top <= 0:
        return 0.0
    return max(priorities.get(name, 0), 0) / top


def factors(job: JobFactorsInput, weights: PriorityWeights, now: float) -> PriorityFactors:
    return PriorityFactors(
        age=age_factor(job.eligible_at, now, weights.max_age_s),
        fairshare=min(max(job.fairshare, 0.0), 1.0),
        jobsize=jobsize_factor(job.gpus, job.cluster_gpus, favor_small=weights.favor_small),
        partition=relative_factor(job.partition, weights.partition_priorities),
        qos=relative_factor(job.qos, weights.qos_priorities),
    )


def priority(job: JobFactorsInput, weights: PriorityWeights, now: float) -> PriorityBreakdown:
    """The priority of a pending job at `now`, with the contribution of every factor."""
    f = factors(job, weights, now)
    age = weights.age * f.age
    fairshare = weights.fairshare * f.fairshare
    jobsize = weights.jobsize * f.jobsize
    partition = weights.partition * f.partition
    qos = weights.qos * f.qos
    total = max(0.0, age + fairshare + jobsize + partition + qos - job.nice)
    return PriorityBreakdown(
        total=total,
        age=age,
        fairshare=fairshare,
        jobsize=jobsize,
        partition=partition,
        qos=qos,
        nice=job.nice,
        factors=f,
    )
