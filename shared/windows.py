"""Pure: the occurrence of a reservation or maintenance window seen from `now` — the
one open now, else the next (daily and weekly ones repeat from their first start).

The placer plans around them (services/placer/core/calendar.py); `scontrol show
reservation` and `sinfo -T` show them (admission's NodesReply).
"""

from __future__ import annotations

import math

PERIOD_S = {"daily": 86_400.0, "weekly": 604_800.0}


def occurrence(start: float, duration_s: int, recurrence: str, now: float) -> tuple[float, float]:
    """(start, end) of the window open at `now`, or else the next; a one-off window's
    own, even past. `recurrence`: none, daily or weekly, any case."""
    period = PERIOD_S.get(recurrence.lower())
    if period is not None and start + duration_s <= now:
        start += math.ceil((now - start - duration_s) / period) * period
        if start + duration_s <= now:
            start += period
    return start, start + duration_s
