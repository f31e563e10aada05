"""Pure core: usage over a window of time (`muster report`, like sreport's cluster
AccountUtilizationByUser report): what each account, and each user in it, used.

The fairshare service adds every charge to the hour its tick ended in (`usage_hours`),
so a report sums whole hours, as sreport's hourly rollups do: `window` rounds its
start down and its end up to the hour. Raw GPU-seconds and billed GPU-seconds (the
GPU model's billing weight), never decayed: what was used, not what fair share still
remembers of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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
    """An account (`user` None; its sub-accounts' usage included) or a user in it:
    GPU-seconds used in the window, billed GPU-seconds, and its share of every
    GPU-second used in the window (0 to 1)."""

    account: str
    user: str | None = None
    gpu_seconds: float
    billed: float
    share: float
    depth: int = 1  # 1 under the root, 2 under such an account, ...


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


def below(accounts: Iterable[str], parents: Mapping[str, str | None]) -> tuple[str, ...]:
    """The named accounts and every account under them in the tree (`parents`: account
    -> its parent, None under the root), by name: what a report for them counts."""
    children: dict[str, list[str]] = {}
    for name, parent in parents.items():
        if parent is not None:
            children.setdefault(parent, []).append(name)
    found: set[str] = set()
    todo = list(accounts)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo += children.get(name, ())
    return tuple(sorted(found))


def report_rows(
    usage: Iterable[HourlyUsage],
    *,
    by_user: bool = True,
    parents: Mapping[str, str | None] | None = None,
) -> tuple[ReportRow, ...]:
    """The account tree as sreport lists it: each account (by name among its siblings),
    its users (most used first, then by name) when `by_user`, then its sub-accounts.
    An account's row counts its sub-accounts' usage too. `parents` gives the tree
    (account -> parent, None under the root); an account missing from it, or whose
    parent is, is shown under the root. Accounts and users that used nothing in the
    window are left out."""
    used = [u for u in usage if u.gpu_seconds != 0 or u.billed != 0]
    total = sum(u.gpu_seconds for u in used)
    tree = dict(parents or {})
    for u in used:
        tree.setdefault(u.account, None)
    children: dict[str | None, list[str]] = {}
    for name in tree:
        children.setdefault(_shown_parent(name, tree), []).append(name)
    own: dict[str, list[HourlyUsage]] = {}
    for u in used:
        own.setdefault(u.account, []).append(u)

    def row(account: str, user: str | None, of: Sequence[HourlyUsage], depth: int) -> ReportRow:
        gpu_s = sum(u.gpu_seconds for u in of)
        return ReportRow(
            account=account,
            user=user,
            gpu_seconds=gpu_s,
            billed=sum(u.billed for u in of),
            share=gpu_s / total if total > 0 else 0.0,
            depth=depth,
        )

    counted: dict[str, list[HourlyUsage]] = {}  # each account's subtree, gathered once

    def subtree(account: str) -> list[HourlyUsage]:  # the tree has no cycle left
        if account not in counted:
            below_it = [u for c in children.get(account, ()) for u in subtree(c)]
            counted[account] = own.get(account, []) + below_it
        return counted[account]

    rows: list[ReportRow] = []

    def walk(account: str, depth: int) -> None:
        usage = subtree(account)
        if not usage:
            return
        rows.append(row(account, None, usage, depth))
        if by_user:
            mine = sorted(own.get(account, ()), key=lambda u: (-u.gpu_seconds, u.user))
            rows.extend(row(account, u.user, [u], depth) for u in mine)
        for child in sorted(children.get(account, ())):
            walk(child, depth + 1)

    for top in sorted(children.get(None, ())):
        walk(top, 1)
    return tuple(rows)


def _shown_parent(name: str, tree: Mapping[str, str | None]) -> str | None:
    """`name`'s parent in the report: None when it is not shown, or when the parents
    above `name` come back to it (a cycle, a configuration error: each is then shown
    under the root, and nothing is counted twice)."""
    parent = tree.get(name)
    met = {name}
    up = parent
    while up is not None and up in tree:
        if up in met:
            return None
        met.add(up)
        up = tree[up]
    return parent if parent in tree else None


def render_report(
    rows: Sequence[ReportRow], since: float, until: float, unit: TimeUnit = TimeUnit.HOURS
) -> str:
    """The window, then the table; GPU time in `unit`, two decimals (seconds whole)."""
    digits = 0 if unit is TimeUnit.SECONDS else 2
    header = [c.format(unit=unit.value) for c in REPORT_COLUMNS]
    body = [
        [
            " " * (r.depth - 1) + r.account,  # a sub-account indented, as sshare's
            r.user or "",
            f"{r.gpu_seconds / unit.seconds:.{digits}f}",
            f"{r.billed / unit.seconds:.{digits}f}",
            f"{100 * r.share:.2f}%",
        ]
        for r in rows
    ]
    title = f"Usage {fmt_time(since)} - {fmt_time(until)} (UTC), GPU time in {unit.value}"
    return title + "\n" + table(header, body, left=2)
