"""Pure core: half-life decay of usage and periodic usage resets (calendar math in UTC).

    decay(u, t, h) = u * 2 ** (-t / h)

so usage halves every half-life and decaying by a then b equals decaying by a + b. A
half-life of 0 (Slurm's PriorityDecayHalfLife=0) means no decay; sites then rely on a
reset period instead. Reset boundaries follow Slurm's PriorityUsageResetPeriod: daily at
00:00, weekly on Sunday 00:00, monthly on the 1st, quarterly on Jan/Apr/Jul/Oct 1st and
yearly on Jan 1st, all at 00:00 UTC. Times are epoch seconds; nothing reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import TypeVar

HALF_LIFE_DEFAULT_S = 7 * 24 * 3600  # Slurm's PriorityDecayHalfLife default, 7-0

K = TypeVar("K")


class ResetPeriod(StrEnum):
    NONE = "none"
    DAILY = "daily"
    WEEKLY = "weekly"
    MONTHLY = "monthly"
    QUARTERLY = "quarterly"
    YEARLY = "yearly"


def decay_factor(elapsed_s: float, half_life_s: float = HALF_LIFE_DEFAULT_S) -> float:
    """The multiplier for `elapsed_s` seconds; 1.0 when decay is off or time ran backwards."""
    if half_life_s <= 0 or elapsed_s <= 0:
        return 1.0
    return float(2.0 ** (-elapsed_s / half_life_s))


def decay(usage: float, elapsed_s: float, half_life_s: float = HALF_LIFE_DEFAULT_S) -> float:
    return usage * decay_factor(elapsed_s, half_life_s)


def decay_all(
    usage: Mapping[K, float], elapsed_s: float, half_life_s: float = HALF_LIFE_DEFAULT_S
) -> dict[K, float]:
    """Decay every entry of a usage map by the same elapsed time."""
    f = decay_factor(elapsed_s, half_life_s)
    return {k: v * f for k, v in usage.items()}


def period_start(now: float, period: ResetPeriod) -> float | None:
    """Epoch seconds of the latest reset boundary at or before `now`; None for NONE."""
    t = datetime.fromtimestamp(now, tz=UTC)
    midnight = t.replace(hour=0, minute=0, second=0, microsecond=0)
    match period:
        case ResetPeriod.NONE:
            return None
        case ResetPeriod.DAILY:
            start = midnight
        case ResetPeriod.WEEKLY:
            # weekday(): Monday 0 .. Sunday 6; Slurm resets on Sunday.
            start = midnight - timedelta(days=(t.weekday() + 1) % 7)
        case ResetPeriod.MONTHLY:
            start = midnight.replace(day=1)
        case ResetPeriod.QUARTERLY:
            start = midnight.replace(month=3 * ((t.month - 1) // 3) + 1, day=1)
        case ResetPeriod.YEARLY:
            start = midnight.replace(month=1, day=1)
    return start.timestamp()


def reset_due(last_reset: float | None, now: float, period: ResetPeriod | str) -> bool:
    """True when a reset boundary lies after `last_reset` and at or before `now`.

    `last_reset=None` (never reset) means due as soon as a boundary exists.
    """
    start = period_start(now, ResetPeriod(period))
    if start is None:
        return False
    return last_reset is None or start > last_reset


def advance(
    usage: Mapping[K, float],
    last_at: float,
    now: float,
    *,
    half_life_s: float = HALF_LIFE_DEFAULT_S,
    period: ResetPeriod | str = ResetPeriod.NONE,
    last_reset: float | None = None,
) -> tuple[dict[K, float], float | None]:
    """Usage carried from `last_at` to `now`, and the new time of the last reset.

    If a reset boundary passed since `last_reset`, usage starts again from zero (an
    empty map) and the boundary becomes the last reset; otherwise it decays.
    """
    if reset_due(last_reset, now, period):
        return {}, period_start(now, ResetPeriod(period))
    return decay_all(usage, now - last_at, half_life_s), last_reset
