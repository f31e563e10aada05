"""Time limits for traces that record none: how users over-estimate, as a seeded model.

The public traces (Philly, Kalos, openb) carry no time limit. Giving every job exactly
1.5x its real runtime (`padded`) tells a policy that reads the limit every runtime to
within a factor known in advance; real limits are far worse. `realistic` (the default)
draws each job's limit from a model after two workload studies:

- Mu'alem & Feitelson, "Utilization, predictability, workloads, and user runtime
  estimates in scheduling the IBM SP2 with backfilling" (IEEE TPDS 12(6), 2001): the
  accuracy of an estimate (runtime / limit) is spread roughly uniformly over (0, 1], with
  a spike at 1 (jobs killed at their limit).
- Tsafrir, Etsion & Feitelson, "Modeling user runtime estimates" (JSSPP 2005): users
  pick from a handful of round values (15 min, 30 min, 1 h, 2 h, ..., a day, days), so a
  limit is the first popular value above what the user guessed.

So: with probability `hit_share` a job reaches its limit (its limit is its recorded
runtime, to the minute: the trace's end is the kill); otherwise an accuracy `a` is drawn
uniformly in [`min_accuracy`, 1], the guess is runtime / a, and the limit is the first
value of `POPULAR_S` at or above it (past the last one: whole days). The shares are this
project's choice, not fitted to any of these traces; each job's draw is seeded by
(seed, job id), so a prefix of a trace gets the same limits as the whole of it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from enum import StrEnum

import msgspec

from sim.workload import TraceJob

MINUTE, HOUR, DAY = 60, 3600, 86_400
POPULAR_S = (
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    2 * HOUR,
    4 * HOUR,
    8 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    3 * DAY,
    7 * DAY,
)


class LimitMode(StrEnum):
    REALISTIC = "realistic"  # the model above
    PADDED = "padded"  # every job exactly `factor` x its runtime (the old rule)


class LimitModel(msgspec.Struct, frozen=True, kw_only=True):
    mode: LimitMode = LimitMode.REALISTIC
    seed: int = 0
    hit_share: float = 0.10  # jobs that run into their limit
    min_accuracy: float = 0.05  # runtime / limit is at least this (a 20x over-estimate)
    factor: float = 1.5  # PADDED only


REALISTIC = LimitModel()
PADDED = LimitModel(mode=LimitMode.PADDED)


def limit_of(job: TraceJob, model: LimitModel = REALISTIC) -> int:
    """The job's own limit if the trace has one, else one drawn from `model`."""
    if job.time_limit_s is not None:
        return job.time_limit_s
    if model.mode is LimitMode.PADDED:
        return _to_minute(job.duration_s * model.factor)
    rng = random.Random(f"{model.seed}:{job.job_id}")
    if rng.random() < model.hit_share:
        return _to_minute(job.duration_s)
    guess = job.duration_s / rng.uniform(model.min_accuracy, 1.0)
    for value in POPULAR_S:
        if value >= guess:
            return value
    return int(math.ceil(guess / DAY) * DAY)


def with_limits(workload: Sequence[TraceJob], model: LimitModel = REALISTIC) -> list[TraceJob]:
    """Every job with its limit filled in (see `limit_of`)."""
    return [msgspec.structs.replace(j, time_limit_s=limit_of(j, model)) for j in workload]


def _to_minute(seconds: float) -> int:
    return int(math.ceil(seconds / MINUTE) * MINUTE)
