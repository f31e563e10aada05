"""Pure core: usage over a window of time (`muster report`, like sreport's cluster
AccountUtilizationByUser report): what each account, and each user in it, used.

The fairshare service adds every charge to the hour its tick ended in (`usage_hours`),
so a report sums whole hours, as sreport's hourly rollups do: `window` rounds its
start down and its end up to the hour. Raw GPU-seconds and billed GPU-seconds (the
GPU model's billing weight), never decayed: what was used, not what fair share still
remembers of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

import msgspec

from services.fairshare.render import fmt_time, table

HOUR_S = 3600.0
DAY_S = 86400.0

REPORT_COLUMNS = ("Account", "User", "GPU-{unit}", "Billed-{unit}", "Share")


class TimeUnit(StrEnum):
    """sreport's `-t`: what the GPU-time columns count."""

    SECONDS = "seconds"
    MINUTES = "minutes"
    HOURS = "hours"

    @property
    def seconds(self) -> float:
        return {"seconds": 1.0, "minutes": 60.0, "hours": HOUR_S}[self.value]


class HourlyUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One user association's usage summed over the window's hours."""

    account: str
    user: str
    gpu_seconds: float
    billed: float


class ReportRow(msgspec.Struct, frozen=True, kw_only=True):
    """An account (`user` None) or a user in it: GPU-seconds used in the window, billed
    GPU-seconds, and its share of every GPU-second used in the window (0 to 1)."""

    account: str
    user: str | None = None
    gpu_seconds: float
    billed: float
    share: float


def window(since: float | None, until: float | None, now: float) -> tuple[float, float]:
    """The whole hours a report covers: from `since` rounded down to until `until`
    rounded up. Neither given: sreport's default, yesterday, midnight to midnight
    (UTC); `since` alone: until now. A window that ends before it starts raises
    ValueError, saying what to change."""
    today = now // DAY_S * DAY_S
    start = today - DAY_S if since is None else since
    end = until if until is not None else (today if since is None else now)
    start = start // HOUR_S * HOUR_S
    end = -(-end // HOUR_S) * HOUR_S
    if end <= start:
        raise ValueError(
            f"the window ends ({fmt_time(end)}) before it starts ({fmt_time(start)}):"
            " give an end (-E) after the start (-S)"
        )
    return start, end


def report_rows(usage: Iterable[HourlyUsage], *, by_user: bool = True) -> tuple[ReportRow, ...]:
    """A row per account (by name), each followed by its users' (most used first, then
    by name) when `by_user`; associations that used nothing are left out."""
    used = [u for u in usage if u.gpu_seconds != 0 or u.billed != 0]
    total = sum(u.gpu_seconds for u in used)

    def share(gpu_seconds: float) -> float:
        return gpu_seconds / total if total > 0 else 0.0

    def row(account: str, user: str | None, of: Sequence[HourlyUsage]) -> ReportRow:
        gpu_s = sum(u.gpu_seconds for u in of)
        billed = sum(u.billed for u in of)
        return ReportRow(
            account=account, user=user, gpu_seconds=gpu_s, billed=billed, share=share(gpu_s)
        )

    rows: list[ReportRow] = []
    for account in sorted({u.account for u in used}):
        mine = [u for u in used if u.account == account]
        rows.append(row(account, None, mine))
        if by_user:
            rows += [
                row(account, u.user, [u])
                for u in sorted(mine, key=lambda u: (-u.gpu_seconds, u.user))
            ]
    return tuple(rows)


def render_report(
    rows: Sequence[ReportRow], since: float, until: float, unit: TimeUnit = TimeUnit.HOURS
) -> str:
    """The window, then the table; GPU time in `unit`, two decimals (seconds whole)."""
    digits = 0 if unit is TimeUnit.SECONDS else 2
    header = [c.format(unit=unit.value) for c in REPORT_COLUMNS]
    body = [
        [
            r.account,
            r.user or "",
            f"{r.gpu_seconds / unit.seconds:.{digits}f}",
            f"{r.billed / unit.seconds:.{digits}f}",
            f"{100 * r.share:.2f}%",
        ]
        for r in rows
    ]
    title = f"Usage {fmt_time(since)} - {fmt_time(until)} (UTC), GPU time in {unit.value}"
    return title + "\n" + table(header, body, left=2)
