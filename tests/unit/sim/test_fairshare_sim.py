"""Fair share in the trace simulator: the same pure core the service runs, through the
simulator's `priority_fn` hook, over a simulated week on a saturated cluster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.fairshare.calculator import FairShareCalculator, make_priority_fn
from services.fairshare.config import SERVICE_WEIGHTS
from services.fairshare.tree import Account, AccountTree, UserAssoc
from services.placer.core import JobRequest
from sim import POLICIES, TraceJob, make_cluster
from sim.engine import Simulation
from sim.limits import PADDED

HOUR = 3600.0
WEEK = 7 * 24 * HOUR
NEWCOMER_AT = 3.5 * 24 * HOUR + 0.2 * HOUR  # mid-week, between two completions

# "new" is configured (as an operator adds an account) but has no usage before its
# first job arrives mid-week; its shares do not change how big and small compare.
TREE = AccountTree(
    accounts=(
        Account(name="big", shares=70),
        Account(name="small", shares=30),
        Account(name="new", shares=10),
    ),
    users=(
        UserAssoc(user="ann", account="big"),
        UserAssoc(user="sam", account="small"),
        UserAssoc(user="nia", account="new"),
    ),
)


def saturating_workload() -> list[TraceJob]:
    """Both accounts keep a backlog all week: 20 jobs each at once, then one each every
    30 minutes (4 jobs an hour against the cluster's ~2.7), one 8-GPU node for 2-4 hours.
    A third account arrives mid-week with one job and no usage."""
    jobs: list[TraceJob] = []
    for account, user in (("big", "ann"), ("small", "sam")):
        submits = [0.0] * 20 + [i * 0.5 * HOUR for i in range(1, int(WEEK / (0.5 * HOUR)))]
        for i, t in enumerate(submits):
            duration = (2.0 + (i * 7 % 5) * 0.5) * HOUR  # 2, 2.5, ... 4 hours, mixed
            jobs.append(
                TraceJob(
                    job_id=0,
                    submit_s=t,
                    duration_s=duration,
                    gpus_per_node=8,
                    user=user,
                    account=account,
                )
            )
    jobs.append(
        TraceJob(
            job_id=0, submit_s=NEWCOMER_AT, duration_s=HOUR, gpus_per_node=8, user="nia",
            account="new",
        )
    )  # fmt: skip
    jobs.sort(key=lambda j: (j.submit_s, j.account))
    return [TraceJob(**{**_fields(j), "job_id": i + 1}) for i, j in enumerate(jobs)]


def _fields(job: TraceJob) -> dict[str, Any]:
    return {f: getattr(job, f) for f in job.__struct_fields__}


class WeekWatcher:
    """Wraps the hook to keep the usage the simulator reports at the last pass within
    the week (it counts running jobs up to that moment)."""

    def __init__(self) -> None:
        calc = FairShareCalculator(TREE)
        self.inner = make_priority_fn(calc, SERVICE_WEIGHTS, cluster_gpus=64)
        self.usage: dict[str, float] = {}
        self.at = 0.0

    def __call__(self, job: JobRequest, now: float, usage: Mapping[str, float]) -> float:
        if now <= WEEK and now >= self.at:
            self.usage, self.at = dict(usage), now
        return self.inner(job, now, usage)


def simulate() -> tuple[Simulation, WeekWatcher]:
    watcher = WeekWatcher()
    sim = Simulation(
        saturating_workload(),
        make_cluster(nodes=8, gpus_per_node=8),
        POLICIES["muster"],
        priority_fn=watcher,
        queue_depth=100,
        limits=PADDED,
    )
    sim.loop()
    return sim, watcher


def test_two_saturating_accounts_get_gpu_hours_within_5_points_of_their_70_30_shares() -> None:
    _, week = simulate()

    big, small = week.usage["big"], week.usage["small"]
    assert week.at > WEEK - 4 * HOUR  # measured at the end of the week
    assert (big + small) / (64 * week.at) > 0.95  # the cluster stayed saturated
    assert abs(big / (big + small) - 0.70) < 0.05
    assert abs(small / (big + small) - 0.30) < 0.05


def test_a_new_account_without_usage_starts_ahead_of_everyone_queued() -> None:
    sim, _ = simulate()

    (new_job,) = [j for j in sim.jobs.values() if j.account == "new"]
    started = sim.ledger.first_start[new_job.job_id]
    overtaken = [
        j
        for j in sim.jobs.values()
        if j.account != "new"
        and j.submit_s < new_job.submit_s
        and new_job.submit_s <= sim.ledger.first_start[j.job_id] < started
    ]
    passed = [
        j
        for j in sim.jobs.values()
        if j.account != "new"
        and j.submit_s < new_job.submit_s
        and sim.ledger.first_start[j.job_id] > started
    ]
    assert overtaken == []  # no job queued before it started before it
    assert {j.account for j in passed} == {"big", "small"}  # and both had jobs queued
    assert 0 < started - new_job.submit_s <= 0.5 * HOUR  # the first 8 GPUs that came free
