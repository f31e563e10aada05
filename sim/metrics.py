"""Simulation bookkeeping and the figures a run reports (SimResult)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping

import msgspec

from services.placer.core import Node, Running
from sim.workload import TraceJob


class SimResult(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    jobs: int
    finished: int
    never_started: int
    queue_delay_mean_s: float
    queue_delay_median_s: float
    queue_delay_p99_s: float
    jct_mean_s: float
    jct_median_s: float
    gpu_utilization: float  # GPU-seconds delivered / (healthy GPUs x span)
    multi_node_in_one_leaf: float | None  # of multi-node starts, share inside one leaf switch
    longest_wait_64gpu_s: float | None  # longest queueing delay of jobs of >= 64 GPUs
    preemptions: int
    failures: int
    requeues: int
    span_s: float
    passes: int  # place() calls
    wall_s: float
    gpu_seconds_by_account: dict[str, float]
    production_delay_mean_s: float | None = None  # the traced cluster's own, where known
    production_delay_median_s: float | None = None
    production_delay_p99_s: float | None = None
    # each job's first estimated start (a booking's) against its real first start
    estimated_jobs: int = 0  # jobs that got an estimate while waiting, and then started
    estimate_error_median_s: float | None = None  # |real - first estimate|
    estimate_error_p90_s: float | None = None
    estimate_late_share: float | None = None  # share that started after their estimate
    waits_64gpu_s: dict[int, float] = {}  # job id: queueing delay, jobs of >= 64 GPUs
    # the share above counted only over the gangs the largest leaf could hold (one wider
    # than a leaf is never inside one: Kalos x10 at 32 nodes starts 39 such of 183)
    multi_node_fitting_in_one_leaf: float | None = None


def wide_over(result: SimResult, easy: SimResult) -> list[int]:
    """Issue 20's bar: the jobs of >= 64 GPUs that wait more than 1.5 x their wait under
    easy (with a minute's slack, so jobs easy starts at once are not counted for seconds)."""
    base = easy.waits_64gpu_s
    return [j for j, w in result.waits_64gpu_s.items() if w > 1.5 * base.get(j, 0) + 60]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Ledger:
    """What happened to each job, as the simulation goes."""

    def __init__(self, cluster: tuple[Node, ...]) -> None:
        self.gpus = sum(sum(g.healthy for g in n.gpus) for n in cluster)
        self.first_start: dict[int, float] = {}
        self.first_estimate: dict[int, float] = {}
        self.finished_at: dict[int, float] = {}
        self.by_account: dict[str, float] = {}
        self.multi = 0
        self.multi_one_leaf = 0
        self.fitting = 0  # multi-node starts the largest leaf could hold
        self.fitting_one_leaf = 0
        self.topology = any(n.topology for n in cluster)
        leaves = Counter(n.topology[-1] for n in cluster if n.topology)
        self.leaf_nodes = max(leaves.values(), default=0)
        self.preemptions = 0
        self.failures = 0
        self.requeues = 0
        self.last = 0.0

    def started(self, job_id: int, run: Running, job: TraceJob, nodes: Mapping[str, Node]) -> None:
        self.first_start.setdefault(job_id, run.started_at)
        if len(run.grants) > 1:
            self.multi += 1
            leaves = {nodes[g.node].topology[-1:] for g in run.grants}
            one = len(leaves) == 1
            self.multi_one_leaf += one
            if len(run.grants) <= self.leaf_nodes:
                self.fitting += 1
                self.fitting_one_leaf += one

    def estimated(self, job_id: int, at: float) -> None:
        """A waiting job's estimated start; only the first one given counts."""
        if job_id not in self.first_start:
            self.first_estimate.setdefault(job_id, at)

    def ended(self, job_id: int, run: Running, t: float, gpus: int, *, requeued: bool) -> None:
        used = gpus * (t - run.started_at)
        self.by_account[run.account] = self.by_account.get(run.account, 0.0) + used
        self.last = max(self.last, t)
        if requeued:
            self.requeues += 1
        else:
            self.finished_at[job_id] = t

    def usage_at(self, t: float, running: Mapping[int, Running]) -> dict[str, float]:
        """GPU-seconds delivered per account up to t, running jobs included."""
        usage = dict(self.by_account)
        for r in running.values():
            gpus = sum(len(g.gpus) for g in r.grants)
            usage[r.account] = usage.get(r.account, 0.0) + gpus * (t - r.started_at)
        return usage

    def result(
        self, policy: str, jobs: Mapping[int, TraceJob], *, passes: int, wall_s: float
    ) -> SimResult:
        delays = [self.first_start[j] - jobs[j].submit_s for j in self.first_start]
        jcts = [self.finished_at[j] - jobs[j].submit_s for j in self.finished_at]
        big = {
            j: self.first_start[j] - jobs[j].submit_s
            for j in self.first_start
            if jobs[j].gpus >= 64
        }
        signed = [
            self.first_start[j] - at
            for j, at in self.first_estimate.items()
            if j in self.first_start
        ]
        errors = [abs(e) for e in signed]
        first = min((j.submit_s for j in jobs.values()), default=0.0)
        span = max(self.last - first, 1.0)
        prod = [j.production_delay_s for j in jobs.values() if j.production_delay_s is not None]
        return SimResult(
            policy=policy,
            jobs=len(jobs),
            finished=len(self.finished_at),
            never_started=len(jobs) - len(self.first_start),
            queue_delay_mean_s=statistics.fmean(delays) if delays else 0.0,
            queue_delay_median_s=statistics.median(delays) if delays else 0.0,
            queue_delay_p99_s=_pct(delays, 0.99),
            jct_mean_s=statistics.fmean(jcts) if jcts else 0.0,
            jct_median_s=statistics.median(jcts) if jcts else 0.0,
            gpu_utilization=sum(self.by_account.values()) / (self.gpus * span)
            if self.gpus
            else 0.0,
            multi_node_in_one_leaf=self.multi_one_leaf / self.multi
            if self.multi and self.topology
            else None,
            multi_node_fitting_in_one_leaf=self.fitting_one_leaf / self.fitting
            if self.fitting and self.topology
            else None,
            longest_wait_64gpu_s=max(big.values()) if big else None,
            preemptions=self.preemptions,
            failures=self.failures,
            requeues=self.requeues,
            span_s=span,
            passes=passes,
            wall_s=wall_s,
            gpu_seconds_by_account=dict(sorted(self.by_account.items())),
            production_delay_mean_s=statistics.fmean(prod) if prod else None,
            production_delay_median_s=statistics.median(prod) if prod else None,
            production_delay_p99_s=_pct(prod, 0.99) if prod else None,
            estimated_jobs=len(errors),
            estimate_error_median_s=statistics.median(errors) if errors else None,
            estimate_error_p90_s=_pct(errors, 0.90) if errors else None,
            estimate_late_share=sum(e > 0 for e in signed) / len(signed) if signed else None,
            waits_64gpu_s=big,
        )
