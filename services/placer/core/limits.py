"""Pure core, dynamic limits: running GPUs and jobs per user, account and QOS.

Usage counts running jobs and the starts decided earlier in the same pass, so a pass
never overshoots a cap. A missing key has no cap.
"""

from __future__ import annotations

from services.placer.core.model import JobRequest, Limits, Running, Waiting

W = Waiting


class Usage:
    """Running GPUs and jobs per user, account, QOS, (QOS, user) and (QOS, account)."""

    def __init__(self) -> None:
        self.gpus: dict[tuple[str, str], int] = {}
        self.jobs: dict[tuple[str, str], int] = {}

    @classmethod
    def of(cls, running: tuple[Running, ...]) -> Usage:
        usage = cls()
        for r in running:
            usage.add(r.user, r.account, r.qos, sum(len(g.gpus) for g in r.grants))
        return usage

    def add(self, user: str, account: str, qos: str, gpus: int) -> None:
        keys = (("u", user), ("a", account), ("q", qos), ("qu", f"{qos}\0{user}"))
        for key in (*keys, ("qa", f"{qos}\0{account}")):
            self.gpus[key] = self.gpus.get(key, 0) + gpus
            self.jobs[key] = self.jobs.get(key, 0) + 1


Rule = tuple[tuple[str, str], int | None, int | None, Waiting, Waiting]


def _rules(limits: Limits, job: JobRequest) -> list[Rule]:
    """(usage key, GPU cap, job cap, reasons) for every cap that applies to the job."""
    user = limits.users.get(job.user, limits.user_default)
    rules: list[Rule] = [
        (("u", job.user), user.max_gpus, user.max_jobs, W.USER_MAX_GPUS, W.USER_MAX_JOBS)
    ]
    acc = limits.accounts.get(job.account)
    if acc is not None:
        key = ("a", job.account)
        rules.append((key, acc.max_gpus, acc.max_jobs, W.ACCOUNT_MAX_GPUS, W.ACCOUNT_MAX_JOBS))
    qos = limits.qos.get(job.qos)
    if qos is not None:
        rules.append((("q", job.qos), qos.max_gpus, qos.max_jobs, W.QOS_MAX_GPUS, W.QOS_MAX_JOBS))
        per_user = (qos.max_gpus_per_user, qos.max_jobs_per_user)
        reasons = (W.QOS_MAX_GPUS_PER_USER, W.QOS_MAX_JOBS_PER_USER)
        rules.append((("qu", f"{job.qos}\0{job.user}"), *per_user, *reasons))
        per_account = (qos.max_gpus_per_account, qos.max_jobs_per_account)
        reasons = (W.QOS_MAX_GPUS_PER_ACCOUNT, W.QOS_MAX_JOBS_PER_ACCOUNT)
        rules.append((("qa", f"{job.qos}\0{job.account}"), *per_account, *reasons))
    return rules


def check(limits: Limits, usage: Usage, job: JobRequest, gpus: int) -> tuple[Waiting, str] | None:
    """The first limit that starting `gpus` more GPUs for this job would break."""
    for key, max_gpus, max_jobs, gpu_reason, job_reason in _rules(limits, job):
        held = usage.gpus.get(key, 0)
        if max_gpus is not None and held + gpus > max_gpus:
            return gpu_reason, f"{held} GPUs running + {gpus} asked > {max_gpus}"
        if max_jobs is not None and usage.jobs.get(key, 0) + 1 > max_jobs:
            return job_reason, f"{usage.jobs.get(key, 0)} jobs running, cap {max_jobs}"
    return None


def headroom(limits: Limits, usage: Usage, job: JobRequest) -> int | None:
    """GPUs the job may still take under its tightest GPU cap (None: uncapped)."""
    rooms = [
        max_gpus - usage.gpus.get(key, 0)
        for key, max_gpus, _, _, _ in _rules(limits, job)
        if max_gpus is not None
    ]
    return min(rooms) if rooms else None
