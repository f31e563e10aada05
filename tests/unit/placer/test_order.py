"""Table tests of the queue order (core/order.py) under the placer's own policy."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core import MUSTER_POLICY, JobRequest, PolicyConfig, rank_key
from tests.unit.placer.helpers import T0, gang

DAY = 86_400.0


def first(jobs: list[JobRequest], config: PolicyConfig = MUSTER_POLICY) -> list[int]:
    return [j.job_id for j in sorted(jobs, key=lambda j: rank_key(j, T0, config))]


CASES = {
    "the job predicted to free the queue soonest goes first": (
        [
            gang(1, nodes=4, gpus_per_node=8, time_limit_s=86_400),
            gang(2, gpus_per_node=1, time_limit_s=7200, predicted_s=600),  # 2,078 s
            gang(3, gpus_per_node=1, time_limit_s=3600),
        ],
        [2, 3, 1],
    ),
    "a prediction is hedged by the job's own limit (their geometric mean)": (
        [
            gang(1, gpus_per_node=1, time_limit_s=86_400, predicted_s=600),  # 7,200 s
            gang(2, gpus_per_node=1, time_limit_s=3600),
        ],
        [2, 1],
    ),
    "a wide job predicted short waits behind a narrow one that asks for less": (
        [
            gang(1, nodes=8, gpus_per_node=8, time_limit_s=3 * 86_400, predicted_s=60),
            gang(2, gpus_per_node=8, time_limit_s=4 * 3600),
        ],
        [2, 1],
    ),
    "a higher tier still goes first whatever its size": (
        [gang(1, gpus_per_node=1), gang(2, nodes=8, gpus_per_node=8, tier=1)],
        [2, 1],
    ),
    "a much higher fair-share priority outweighs the size": (
        [gang(1, gpus_per_node=1), gang(2, nodes=8, gpus_per_node=8, priority=1000.0)],
        [2, 1],
    ),
    "a wide job that waited past the bound goes ahead of every younger one": (
        [
            gang(1, gpus_per_node=1, time_limit_s=600),
            gang(2, nodes=16, gpus_per_node=8, submitted_at=T0 - 8 * DAY),
        ],
        [2, 1],
    ),
    "aged jobs among themselves: by priority and age, without the size": (
        [
            gang(1, nodes=2, gpus_per_node=8, submitted_at=T0 - 9 * DAY),
            gang(2, gpus_per_node=1, submitted_at=T0 - 8 * DAY, priority=50.0),
            gang(3, gpus_per_node=1, submitted_at=T0 - 10 * DAY),
        ],
        [2, 3, 1],
    ),
}


@pytest.mark.parametrize(("jobs", "want"), CASES.values(), ids=CASES.keys())
def test_rank_key(jobs: list[JobRequest], want: list[int]) -> None:
    assert first(jobs) == want


TRUST = {  # order_trust: which of a job predicted short and one that asks for less leads
    "the prediction alone": (1.0, [1, 2]),
    "their geometric mean": (0.5, [2, 1]),
    "the limit alone": (0.0, [2, 1]),
}


@pytest.mark.parametrize(("trust", "want"), TRUST.values(), ids=TRUST.keys())
def test_order_trust_weighs_the_prediction_against_the_limit(trust: float, want: list[int]) -> None:
    jobs = [
        gang(1, gpus_per_node=1, time_limit_s=86_400, predicted_s=600),
        gang(2, gpus_per_node=1, time_limit_s=3600),
    ]
    assert first(jobs, msgspec.structs.replace(MUSTER_POLICY, order_trust=trust)) == want


def test_without_predictions_the_order_counts_the_limit_whatever_the_trust() -> None:
    jobs = [
        gang(1, gpus_per_node=1, time_limit_s=86_400, predicted_s=600),
        gang(2, gpus_per_node=1, time_limit_s=3600),
    ]
    config = msgspec.structs.replace(MUSTER_POLICY, order_trust=1.0, use_predictions=False)
    assert first(jobs, config) == [2, 1]


def test_the_mechanism_default_keeps_priority_then_submit_order() -> None:
    jobs = [gang(1, nodes=8, gpus_per_node=8), gang(2, gpus_per_node=1)]
    assert first(jobs, PolicyConfig()) == [1, 2]
