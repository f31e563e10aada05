"""Table tests of the size-scaled age bound (order.py: wait_bound) and the protected
oldest head (order.py: ranked), both options off in MUSTER_POLICY, measured over the
step bound alone (STEP: the default before the linear age term)."""

from __future__ import annotations

import msgspec
import pytest

from services.placer.core import MUSTER_POLICY, JobRequest, PolicyConfig
from services.placer.core.order import ranked, wait_bound
from tests.unit.placer.helpers import T0, gang

H = 3600.0
STEP = PolicyConfig(service_weight=10.0, max_wait_s=72 * H, pack_small=True)
SCALED = msgspec.structs.replace(STEP, age_ref_gpus=8)
HEAD = msgspec.structs.replace(MUSTER_POLICY, protect_oldest=True)

BOUNDS = {
    "no reference size: every job waits max_wait_s": (gang(1, 8, 8), STEP, 72 * H),
    "up to the reference size: max_wait_s": (gang(1, 1, 8), SCALED, 72 * H),
    "8 times the reference size: an eighth of it": (gang(1, 8, 8), SCALED, 9 * H),
    "no max_wait_s: no bound": (gang(1, 8, 8), PolicyConfig(age_ref_gpus=8), float("inf")),
}


@pytest.mark.parametrize(("job", "config", "want"), BOUNDS.values(), ids=BOUNDS.keys())
def test_wait_bound(job: JobRequest, config: PolicyConfig, want: float) -> None:
    assert wait_bound(job, config) == want


def order(jobs: list[JobRequest], config: PolicyConfig) -> list[int]:
    return [j.job_id for j in ranked(jobs, T0, config)]


WIDE_10H = gang(1, nodes=8, gpus_per_node=8, time_limit_s=7200, submitted_at=T0 - 10 * H)
SMALL = gang(2, gpus_per_node=1, time_limit_s=600)

ORDERS = {
    "the score puts a wide job that waited 10 h behind a small one": (
        [WIDE_10H, SMALL],
        MUSTER_POLICY,
        [2, 1],
    ),
    "scaled by size, 10 h is past its 9 h bound: it goes first": (
        [WIDE_10H, SMALL],
        SCALED,
        [1, 2],
    ),
    "the protected head is the oldest job": ([SMALL, WIDE_10H], HEAD, [1, 2]),
    "a held oldest job is not the head": (
        [msgspec.structs.replace(WIDE_10H, held=True), SMALL],
        HEAD,
        [2, 1],
    ),
    "the head is the oldest of the top priority only": (
        [WIDE_10H, msgspec.structs.replace(SMALL, priority=50.0), gang(3, gpus_per_node=1)],
        HEAD,
        [2, 3, 1],
    ),
}


@pytest.mark.parametrize(("jobs", "config", "want"), ORDERS.values(), ids=ORDERS.keys())
def test_ranked(jobs: list[JobRequest], config: PolicyConfig, want: list[int]) -> None:
    assert order(jobs, config) == want
