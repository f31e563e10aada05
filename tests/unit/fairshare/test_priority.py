"""Multifactor priority: each factor in [0, 1] times its weight, nice subtracted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.fairshare.priority import (
    JobFactorsInput,
    PriorityBreakdown,
    PriorityFactors,
    PriorityWeights,
    jobsize_factor,
    priority,
)

DAY = 86400.0
NOW = 1_800_000_000.0

WEIGHTS = PriorityWeights(
    age=1000,
    fairshare=10000,
    jobsize=500,
    partition=2000,
    qos=3000,
    partition_priorities={"normal": 1, "urgent": 4},
    qos_priorities={"normal": 0, "high": 10, "low": 5},
)


def job(**overrides: object) -> JobFactorsInput:
    base: dict[str, object] = {
        "eligible_at": NOW,
        "fairshare": 0.0,
        "gpus": 0,
        "cluster_gpus": 64,
        "partition": "normal",
        "qos": "normal",
        "nice": 0,
    }
    return JobFactorsInput(**(base | overrides))  # type: ignore[arg-type]


CASES: dict[str, tuple[JobFactorsInput, PriorityWeights, PriorityBreakdown]] = {
    "a fresh job with nothing going for it has only its partition": (
        job(),
        WEIGHTS,
        PriorityBreakdown(total=500.0, partition=500.0, factors=PriorityFactors(partition=0.25)),
    ),
    "age grows linearly up to the max age": (
        job(eligible_at=NOW - 3.5 * DAY, partition="none"),
        WEIGHTS,
        PriorityBreakdown(total=500.0, age=500.0, factors=PriorityFactors(age=0.5)),
    ),
    "age is capped at the max age": (
        job(eligible_at=NOW - 30 * DAY, partition="none"),
        WEIGHTS,
        PriorityBreakdown(total=1000.0, age=1000.0, factors=PriorityFactors(age=1.0)),
    ),
    "a job not yet eligible has no age": (
        job(eligible_at=NOW + DAY, partition="none"),
        WEIGHTS,
        PriorityBreakdown(total=0.0),
    ),
    "every factor weighs in": (
        job(
            eligible_at=NOW - 7 * DAY,
            fairshare=0.5,
            gpus=16,
            partition="urgent",
            qos="high",
        ),
        WEIGHTS,
        PriorityBreakdown(
            total=1000.0 + 5000.0 + 125.0 + 2000.0 + 3000.0,
            age=1000.0,
            fairshare=5000.0,
            jobsize=125.0,
            partition=2000.0,
            qos=3000.0,
            factors=PriorityFactors(age=1.0, fairshare=0.5, jobsize=0.25, partition=1.0, qos=1.0),
        ),
    ),
    "nice is subtracted": (
        job(fairshare=1.0, partition="none", nice=2500),
        WEIGHTS,
        PriorityBreakdown(
            total=7500.0, fairshare=10000.0, nice=2500, factors=PriorityFactors(fairshare=1.0)
        ),
    ),
    "a negative nice adds": (
        job(partition="none", nice=-100),
        WEIGHTS,
        PriorityBreakdown(total=100.0, nice=-100),
    ),
    "priority never drops below zero": (
        job(qos="low", partition="none", nice=10_000),
        WEIGHTS,
        PriorityBreakdown(total=0.0, qos=1500.0, nice=10_000, factors=PriorityFactors(qos=0.5)),
    ),
    "favor small gives the one-gpu job the full size factor": (
        job(gpus=1, partition="none"),
        PriorityWeights(jobsize=500, favor_small=True),
        PriorityBreakdown(total=500.0, jobsize=500.0, factors=PriorityFactors(jobsize=1.0)),
    ),
    "zero weights give zero whatever the factors": (
        job(eligible_at=NOW - DAY, fairshare=1.0, gpus=64),
        PriorityWeights(),
        PriorityBreakdown(
            total=0.0,
            factors=PriorityFactors(age=1 / 7, fairshare=1.0, jobsize=1.0),
        ),
    ),
}


@pytest.mark.parametrize(("j", "weights", "want"), CASES.values(), ids=CASES.keys())
def test_priority(j: JobFactorsInput, weights: PriorityWeights, want: PriorityBreakdown) -> None:
    assert priority(j, weights, NOW) == want


SIZE_CASES = {
    "the whole cluster is one": (64, 64, False, 1.0),
    "more than the cluster is still one": (128, 64, False, 1.0),
    "a quarter of the cluster is a quarter": (16, 64, False, 0.25),
    "no gpus is zero": (0, 64, False, 0.0),
    "an unknown cluster size gives zero": (8, 0, False, 0.0),
    "favoring small, the whole cluster is zero": (64, 64, True, 0.0),
    "favoring small, one gpu is one": (1, 64, True, 1.0),
    "favoring small, a cpu-only job counts as one gpu": (0, 64, True, 1.0),
    "favoring small on a one-gpu cluster is one": (1, 1, True, 1.0),
}


@pytest.mark.parametrize(
    ("gpus", "cluster", "small", "want"), SIZE_CASES.values(), ids=SIZE_CASES.keys()
)
def test_jobsize_factor(gpus: int, cluster: int, small: bool, want: float) -> None:
    assert jobsize_factor(gpus, cluster, favor_small=small) == want


@given(
    waited=st.floats(min_value=-1e7, max_value=1e9),
    fairshare=st.floats(min_value=0.0, max_value=1.0),
    gpus=st.integers(min_value=0, max_value=10_000),
    partition=st.sampled_from(["normal", "urgent", "other"]),
    qos=st.sampled_from(["normal", "high", "low", "other"]),
)
def test_every_factor_stays_within_zero_and_one(
    waited: float, fairshare: float, gpus: int, partition: str, qos: str
) -> None:
    b = priority(
        job(eligible_at=NOW - waited, fairshare=fairshare, gpus=gpus, partition=partition, qos=qos),
        WEIGHTS,
        NOW,
    )
    f = b.factors
    assert all(0.0 <= v <= 1.0 for v in (f.age, f.fairshare, f.jobsize, f.partition, f.qos))
    assert b.total == b.age + b.fairshare + b.jobsize + b.partition + b.qos
