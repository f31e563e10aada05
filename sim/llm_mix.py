"""A synthetic LLM-development workload, seeded: `llm_mix(days, nodes, load, seed)`.

After the Acme paper (Hu et al., "Characterization of Large Language Model Development
in the Datacenter", NSDI'24, clusters Seren and Kalos): evaluation jobs are most of the
jobs and use little GPU time, a few multi-day pretraining gangs use most of it, with
debugging and fine-tuning (SFT) runs between. The class shares, sizes and runtimes below
are this project's reading of those findings, not a fit to the per-job logs (which are
not here); `summary()` gives the aggregates to set beside the Kalos row of Acme's
`cluster_summary.csv` (median 1 GPU, median run 124 s, max run 7.2 days).

| class | share of jobs | GPUs (weight) | runtime |
| --- | ---: | --- | --- |
| eval | 75% | 1 (70), 2 (5), 4 (10), 8 (15) | lognormal, median 2 min, sigma 1.0, at most 6 h |
| debug | 15% | 1 (50), 8 (30), 16 (20) | lognormal, median 5 min, sigma 1.3, at most 4 h |
| sft | 9% | 16 (40), 32 (35), 64 (25) | lognormal, median 3 h, sigma 0.8, at most 2 days |
| pretrain | 1% | 1/4 or 1/2 of the cluster | uniform 1 to 5 days |

Arrivals are Poisson at the rate that offers `load` x the cluster's GPU-seconds; each
class has its own few users (eval-0.., dbg-0.., sft-0.., pre-0..), one account each.
"""

from __future__ import annotations

import math
import random
import statistics
from typing import NamedTuple

from sim.workload import TraceJob, shaped


class JobClass(NamedTuple):
    name: str
    share: float
    gpus: tuple[tuple[int, float], ...]  # (GPUs, weight); 0: a fraction of the cluster
    median_s: float  # lognormal median; uniform low for pretrain
    sigma: float  # lognormal sigma; 0: uniform median_s..cap_s
    cap_s: float
    users: int


def classes(cluster_gpus: int) -> tuple[JobClass, ...]:
    quarter, half = max(8, cluster_gpus // 4), max(8, cluster_gpus // 2)
    return (
        JobClass("eval", 0.75, ((1, 70), (2, 5), (4, 10), (8, 15)), 120, 1.0, 6 * 3600, 6),
        JobClass("debug", 0.15, ((1, 50), (8, 30), (16, 20)), 300, 1.3, 4 * 3600, 8),
        JobClass("sft", 0.09, ((16, 40), (32, 35), (64, 25)), 3 * 3600, 0.8, 2 * 86400, 4),
        JobClass("pretrain", 0.01, ((quarter, 50), (half, 50)), 86400, 0.0, 5 * 86400, 2),
    )


def _runtime(c: JobClass, rng: random.Random) -> float:
    if c.sigma == 0:
        return rng.uniform(c.median_s, c.cap_s)
    return min(c.cap_s, max(10.0, c.median_s * math.exp(rng.gauss(0.0, c.sigma))))


def _mean_gpu_seconds(c: JobClass) -> float:
    """Mean GPUs x mean runtime (the lognormal's mean, its cap ignored)."""
    gpus = sum(n * w for n, w in c.gpus) / sum(w for _, w in c.gpus)
    if c.sigma == 0:
        return gpus * (c.median_s + c.cap_s) / 2
    return gpus * c.median_s * math.exp(c.sigma**2 / 2)


def llm_mix(days: float, nodes: int, load: float = 0.8, seed: int = 0) -> list[TraceJob]:
    """Jobs arriving over `days` on `nodes` nodes of 8 GPUs, offered `load`."""
    gpus = nodes * 8
    mix = classes(gpus)
    rng = random.Random(seed)
    per_job = sum(c.share * _mean_gpu_seconds(c) for c in mix)
    rate = load * gpus / per_job  # jobs per second
    jobs: list[TraceJob] = []
    t = 0.0
    horizon = days * 86400
    shares = [c.share for c in mix]
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        c = rng.choices(mix, shares)[0]
        sizes, weights = zip(*c.gpus, strict=True)
        n = rng.choices(sizes, weights)[0]
        user = f"{c.name[:3]}-{rng.randrange(c.users)}"
        jobs.append(
            TraceJob(
                job_id=len(jobs) + 1,
                submit_s=round(t, 1),
                duration_s=round(_runtime(c, rng), 1),
                user=user,
                account=c.name,
                **shaped(n),  # type: ignore[arg-type]
            )
        )
    return jobs


def summary(jobs: list[TraceJob]) -> dict[str, float]:
    """The aggregates Acme's cluster_summary.csv gives, and each class's GPU-time share."""
    gpu_s = sum(j.gpus * j.duration_s for j in jobs) or 1.0
    out = {
        "jobs": float(len(jobs)),
        "gpus_median": statistics.median(j.gpus for j in jobs),
        "gpus_mean": statistics.fmean(j.gpus for j in jobs),
        "run_median_s": statistics.median(j.duration_s for j in jobs),
        "run_mean_s": statistics.fmean(j.duration_s for j in jobs),
        "run_max_s": max(j.duration_s for j in jobs),
    }
    for name in ("eval", "debug", "sft", "pretrain"):
        mine = [j for j in jobs if j.account == name]
        out[f"{name}_job_share"] = len(mine) / len(jobs)
        out[f"{name}_gpu_time_share"] = sum(j.gpus * j.duration_s for j in mine) / gpu_s
    return out
