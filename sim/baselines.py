"""The `slurm` baseline: Slurm's multifactor priority (age + fair share) with backfill
on the users' own limits, as a site running Slurm's priority/multifactor plugin and
sched/backfill would have it. A pure function of the job, the time and the usage.

    priority = W_AGE x min(1, waited / MAX_AGE) + W_FAIRSHARE x 2^(-U / S)

U is the account's share of all GPU-seconds delivered so far, S its share of the
cluster (equal shares: 1 / accounts seen); this is Slurm's classic fair-share factor,
without usage decay (PriorityDecayHalfLife) over a replay. Weights: 1,000 and 10,000
(a common site setting; Slurm's own defaults are 0, which is FIFO). MAX_AGE is
Slurm's default PriorityMaxAge, 7 days.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.placer.core import JobRequest, PolicyConfig

W_AGE = 1_000.0
W_FAIRSHARE = 10_000.0
MAX_AGE_S = 7 * 86_400.0

# backfill with a reservation for every job it tests (Slurm's bf plans them all), on
# the users' limits, no preemption
SLURM = PolicyConfig(backfill=True, reservation_depth=100, preemption=False, use_predictions=False)


def slurm_priority(job: JobRequest, now: float, usage: Mapping[str, float]) -> float:
    age = min(1.0, max(0.0, now - job.submitted_at) / MAX_AGE_S)
    total = sum(usage.values())
    accounts = len({*usage, job.account})
    used = usage.get(job.account, 0.0) / total if total > 0 else 0.0
    fair: float = 2.0 ** (-used * accounts)  # U / S with S = 1 / accounts
    return W_AGE * age + W_FAIRSHARE * fair
