"""Pure core: allocated GPU time by job size and account over a window (`muster report
--sizes`, sreport's `job SizesByAccount`): which accounts run small jobs and which the
wide gangs, for capacity planning and for checking a partition's shape against use.

Each allocation (a job's attempt) counts its GPUs times the part of its life inside the
window (placed to released, or to now), in the size range its GPU count falls in:
`grouping` (8, 64, 256 by default) gives the ranges 0-7, 8-63, 64-255 and >= 256 GPUs,
as sreport's `grouping=` gives CPU ranges. Rows are the accounts directly under the
root, each with its sub-accounts' time (or the accounts asked for, each with theirs),
as sreport shows one level; an account no longer in the configuration is a row of its
own. The sum of every row is the cluster's allocated GPU time (`muster report
--cluster`) over the same hours, give or take the monitor's passes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise

import msgspec

from services.fairshare.render import fmt_time, table
from services.fairshare.report import TimeUnit

DEFAULT_GROUPING = (8, 64, 256)
TOP = (None, "root")  # the parent of an account directly under the root


class AllocatedTime(msgspec.Struct, frozen=True, kw_only=True):
    """One allocation's GPU-seconds inside the window."""

    job_id: int
    account: str
    gpus: int
    gpu_seconds: float


class SizeRow(msgspec.Struct, frozen=True, kw_only=True):
    """An account's allocated GPU-seconds and jobs per size range, and its part of all
    the window's allocated GPU time (0 to 1)."""

    account: str
    gpu_seconds: tuple[float, ...]
    jobs: tuple[int, ...]
    share: float


def parse_grouping(text: str) -> tuple[int, ...]:
    """`8,64,256` -> (8, 64, 256): the lower bounds of every range after the first,
    increasing whole numbers above 0; ValueError says what to write."""
    try:
        bounds = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError:
        bounds = ()
    return checked_grouping(bounds, text)


def checked_grouping(bounds: Sequence[int], written: str | None = None) -> tuple[int, ...]:
    """`bounds` as a grouping, when they are one (as `parse_grouping` says)."""
    if not bounds or bounds[0] < 1 or any(b <= a for a, b in pairwise(bounds)):
        text = ",".join(map(str, bounds)) if written is None else written
        raise ValueError(
            f"grouping {text!r}: give increasing GPU counts above 0, e.g. 8,64,256"
            " (ranges 0-7, 8-63, 64-255, >= 256)"
        )
    return tuple(bounds)


def range_names(grouping: Sequence[int]) -> list[str]:
    """Each range's column name: `0-7 GPUs`, ..., `>= 256 GPUs`."""
    lows = [0, *grouping]
    names = [f"{lo}-{hi - 1} GPUs" for lo, hi in zip(lows, grouping, strict=False)]
    return [*names, f">= {grouping[-1]} GPUs"]


def size_range(gpus: int, grouping: Sequence[int]) -> int:
    """The index of the range `gpus` falls in."""
    return sum(1 for bound in grouping if gpus >= bound)


def root_of(account: str, parents: Mapping[str, str | None], roots: Iterable[str]) -> str | None:
    """The row `account` counts in: the first of `roots` it is or lies under (the
    accounts under the tree's root when none are named); an account the tree does not
    hold is its own row when no roots were named, and counts nowhere when some were."""
    named = set(roots)
    seen: set[str] = set()
    at: str | None = account
    while at is not None and at not in seen:
        if at in named or (not named and parents.get(at, "") in TOP):
            return at
        seen.add(at)
        parent = parents.get(at)
        at = None if parent in TOP else parent
    return account if not named and account not in parents else None


def size_rows(
    allocated: Iterable[AllocatedTime],
    grouping: Sequence[int],
    parents: Mapping[str, str | None],
    roots: Sequence[str] = (),
) -> list[SizeRow]:
    """The rows, by account name."""
    width = len(grouping) + 1
    seconds: dict[str, list[float]] = {}
    jobs: dict[str, list[set[int]]] = {}
    for a in allocated:
        row = root_of(a.account, parents, roots)
        if row is None:
            continue
        i = size_range(a.gpus, grouping)
        seconds.setdefault(row, [0.0] * width)[i] += a.gpu_seconds
        jobs.setdefault(row, [set() for _ in range(width)])[i].add(a.job_id)
    for name in roots:  # an account asked for is shown even when it ran nothing
        seconds.setdefault(name, [0.0] * width)
        jobs.setdefault(name, [set() for _ in range(width)])
    total = sum(sum(s) for s in seconds.values())
    return [
        SizeRow(
            account=name,
            gpu_seconds=tuple(seconds[name]),
            jobs=tuple(len(j) for j in jobs[name]),
            share=sum(seconds[name]) / total if total else 0.0,
        )
        for name in sorted(seconds)
    ]


def render_sizes(
    rows: Sequence[SizeRow],
    grouping: Sequence[int],
    since: float,
    until: float,
    unit: TimeUnit = TimeUnit.HOURS,
    *,
    job_counts: bool = False,
) -> str:
    """The window, then a row an account: GPU time (or jobs) in each size range, and
    its share of the window's allocated GPU time."""
    digits = 0 if unit is TimeUnit.SECONDS else 2
    header = ["Account", *range_names(grouping), "Share"]
    body = [
        [
            r.account,
            *(
                [str(n) for n in r.jobs]
                if job_counts
                else [f"{s / unit.seconds:.{digits}f}" for s in r.gpu_seconds]
            ),
            f"{100 * r.share:.2f}%",
        ]
        for r in rows
    ]
    what = "jobs" if job_counts else f"allocated GPU time in {unit.value}"
    title = f"Job sizes {fmt_time(since)} - {fmt_time(until)} (UTC), {what}"
    return title + "\n" + table(header, body, left=1)
