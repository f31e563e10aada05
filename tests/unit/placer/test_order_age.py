"""Table tests of the linear age term (order.py: age_weight) and of `standing_key`, the
order a simulator keeps its queue in without re-sorting as time passes."""

from __future__ import annotations

import random

import msgspec
import pytest

from services.placer.core import JobRequest, PolicyConfig, rank_key
from services.placer.core.order import _keyer, ranked, standing_key
from tests.unit.placer.helpers import T0, gang

H = 3600.0
LINEAR = PolicyConfig(service_weight=10.0, age_weight=0.5)
# 64 GPUs for 2 h is 128 GPU-hours: 10 x log2(129) = 70.1; 1 GPU for 10 min: 10 x
# log2(1 + 1/6) = 2.2; at 0.5 an hour the wide job passes the small one after 136 h
WIDE = gang(1, nodes=8, gpus_per_node=8, time_limit_s=7200)
SMALL = gang(2, gpus_per_node=1, time_limit_s=600, submitted_at=T0)


def waited(job: JobRequest, hours: float) -> JobRequest:
    return msgspec.structs.replace(job, submitted_at=T0 - hours * H)


def order(jobs: list[JobRequest], config: PolicyConfig) -> list[int]:
    return [j.job_id for j in sorted(jobs, key=lambda j: rank_key(j, T0, config))]


ORDERS = {
    "fresh: the small job first": ([waited(WIDE, 0), SMALL], LINEAR, [2, 1]),
    "after 130 h the wide job is still behind": ([waited(WIDE, 130), SMALL], LINEAR, [2, 1]),
    "after 140 h it has climbed past": ([waited(WIDE, 140), SMALL], LINEAR, [1, 2]),
    "a heavier age weight: past it in a tenth of the time": (
        [waited(WIDE, 14), SMALL],
        msgspec.structs.replace(LINEAR, age_weight=5.0),
        [1, 2],
    ),
    "no age weight: a wide job never passes on age alone": (
        [waited(WIDE, 1000), SMALL],
        PolicyConfig(service_weight=10.0),
        [2, 1],
    ),
    "equal jobs: the one that waited longer first": (
        [
            gang(3, gpus_per_node=1, submitted_at=T0 - H),
            gang(4, gpus_per_node=1, submitted_at=T0 - 2 * H),
        ],
        LINEAR,
        [4, 3],
    ),
    "a higher tier still goes first whatever it waited": (
        [waited(SMALL, 1000), gang(5, nodes=8, gpus_per_node=8, tier=1, submitted_at=T0)],
        LINEAR,
        [5, 2],
    ),
    "the step bound still applies beside the linear term": (
        [waited(WIDE, 73), SMALL],
        msgspec.structs.replace(LINEAR, max_wait_s=72 * H),
        [1, 2],
    ),
}


@pytest.mark.parametrize(("jobs", "config", "want"), ORDERS.values(), ids=ORDERS.keys())
def test_linear_age_order(jobs: list[JobRequest], config: PolicyConfig, want: list[int]) -> None:
    assert order(jobs, config) == want


def random_jobs(seed: int) -> list[JobRequest]:
    rng = random.Random(seed)
    return [
        gang(
            i,
            nodes=rng.choice((1, 1, 2, 8)),
            gpus_per_node=rng.choice((1, 4, 8)),
            time_limit_s=rng.choice((600, 3600, 86_400)),
            priority=rng.choice((0.0, 0.0, 3.0)),
            tier=rng.choice((0, 0, 1)),
            submitted_at=T0 - rng.uniform(0, 30 * H),
        )
        for i in range(1, 60)
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("later_h", [0.0, 7.0, 200.0])
def test_standing_key_orders_as_rank_key_at_every_now(seed: int, later_h: float) -> None:
    """Without a step bound reached, sorting by the standing key is the order at any
    `now`: the linear term lifts every job alike as time passes."""
    jobs = random_jobs(seed)
    now = T0 + later_h * H
    by_rank = sorted(jobs, key=lambda j: rank_key(j, now, LINEAR))
    by_standing = sorted(jobs, key=lambda j: standing_key(j, LINEAR))
    assert [j.job_id for j in by_rank] == [j.job_id for j in by_standing]


KEYER_CONFIGS = [
    PolicyConfig(),
    LINEAR,
    msgspec.structs.replace(LINEAR, max_wait_s=20 * H, age_ref_gpus=8),
    msgspec.structs.replace(LINEAR, use_predictions=False, max_wait_s=10 * H),
]


@pytest.mark.parametrize("config", KEYER_CONFIGS)
@pytest.mark.parametrize("seed", range(3))
def test_the_pass_key_is_rank_key(config: PolicyConfig, seed: int) -> None:
    """`ranked` sorts by a flattened copy of `rank_key`: the same tuple for every job."""
    jobs = random_jobs(seed)
    rng = random.Random(seed)
    jobs += [
        msgspec.structs.replace(j, predicted_s=rng.choice((30, 900, 200_000)), requeued=True)
        for j in jobs[:20]
    ]
    jobs.append(gang(99, gpus_per_node=0, gpus_total=12, submitted_at=T0 - 25 * H))
    key = _keyer(T0, config)
    assert [key(j) for j in jobs] == [rank_key(j, T0, config) for j in jobs]


@pytest.mark.parametrize("config", KEYER_CONFIGS)
@pytest.mark.parametrize("tiers", [(0,), (0, 1, 2)])
def test_ranked_sorts_by_rank_key(config: PolicyConfig, tiers: tuple[int, ...]) -> None:
    """`ranked` sorts tier by tier on the rest of the key: the order `rank_key` gives."""
    rng = random.Random(len(tiers))
    jobs = [msgspec.structs.replace(j, tier=rng.choice(tiers)) for j in random_jobs(7)]
    jobs += [msgspec.structs.replace(j, job_id=j.job_id + 100) for j in jobs[:10]]  # ties
    want = sorted(jobs, key=lambda j: rank_key(j, T0, config))
    assert [j.job_id for j in ranked(jobs, T0, config)] == [j.job_id for j in want]
