"""Tests of the simulator's time-limit model (sim/limits.py)."""

from __future__ import annotations

import pytest

from sim.limits import PADDED, POPULAR_S, REALISTIC, LimitModel, limit_of, with_limits
from sim.workload import TraceJob


def job(job_id: int, duration: float, limit: int | None = None) -> TraceJob:
    return TraceJob(job_id=job_id, submit_s=0.0, duration_s=duration, time_limit_s=limit)


CASES = {
    "a limit the trace gives is kept whatever the model": (job(1, 100, 7), REALISTIC, 7),
    "padded: 1.5 x the runtime, up to the next minute": (job(1, 1000, None), PADDED, 1500),
    "padded by another factor": (job(1, 600, None), LimitModel(mode=PADDED.mode, factor=2), 1200),
    "every job reaches its limit: the limit is its runtime, to the minute": (
        job(1, 3601, None),
        LimitModel(hit_share=1.0),
        3660,
    ),
    "a guess past a week is rounded up to whole days": (
        job(1, 10 * 86_400, None),
        LimitModel(hit_share=0.0, min_accuracy=1.0),
        10 * 86_400,
    ),
    "a perfect guess is the first popular value at or above the runtime": (
        job(1, 5000, None),
        LimitModel(hit_share=0.0, min_accuracy=1.0),
        2 * 3600,
    ),
}


@pytest.mark.parametrize(("trace_job", "model", "want"), CASES.values(), ids=CASES.keys())
def test_limit_of(trace_job: TraceJob, model: LimitModel, want: int) -> None:
    assert limit_of(trace_job, model) == want


def test_realistic_limits_over_estimate_and_some_jobs_reach_theirs() -> None:
    jobs = [job(i, 60.0 + (i * 7919) % 200_000, None) for i in range(1, 5001)]
    limits = [limit_of(j) for j in jobs]
    assert all(lim >= j.duration_s for j, lim in zip(jobs, limits, strict=True))
    hit = sum(1 for j, lim in zip(jobs, limits, strict=True) if lim - j.duration_s < 60)
    assert 0.07 < hit / len(jobs) < 0.13  # hit_share 0.10
    popular = sum(1 for lim in limits if lim in POPULAR_S)
    assert popular / len(jobs) > 0.7  # round values, but for hits and guesses past a week
    ratios = sorted(j.duration_s / lim for j, lim in zip(jobs, limits, strict=True))
    assert 0.2 < ratios[len(ratios) // 2] < 0.6  # the median job uses a fraction of its limit


def test_limits_are_seeded_per_job_so_a_prefix_gets_the_same_ones() -> None:
    jobs = [job(i, 100.0 * i, None) for i in range(1, 200)]
    whole = with_limits(jobs)
    assert with_limits(jobs[:50]) == whole[:50]
    assert with_limits(jobs, LimitModel(seed=1)) != whole
