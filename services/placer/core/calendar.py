"""Pure core, advance reservations and maintenance windows as seen from `now`.

Each Reservation is reduced to its current or next occurrence (daily and weekly ones
repeat from `start`). A job that is not allowed inside a window may not use the window's
nodes if it could still be running when the window opens: it must end before. A
reservation for a GPU count sets aside whole nodes, the last ones in topology order, so
that the rest of the cluster stays in one piece.
"""

from __future__ import annotations

import msgspec

from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest, Reservation
from shared.windows import occurrence as shared_occurrence


class Window(msgspec.Struct, frozen=True):
    name: str
    start: float
    end: float
    nodes: frozenset[int]
    accounts: frozenset[str]
    maintenance: bool


def occurrence(res: Reservation, now: float) -> tuple[float, float]:
    """The window that is open now, or else the next one (shared/windows.py)."""
    return shared_occurrence(res.start, res.duration_s, res.recurrence.value, now)


def windows(ix: ClusterIndex, reservations: tuple[Reservation, ...], now: float) -> list[Window]:
    out = []
    for res in reservations:
        start, end = occurrence(res, now)
        if end <= now:
            continue
        out.append(
            Window(
                name=res.name,
                start=start,
                end=end,
                nodes=_nodes_of(ix, res),
                accounts=frozenset(() if res.maintenance else res.accounts),
                maintenance=res.maintenance,
            )
        )
    return out


def _nodes_of(ix: ClusterIndex, res: Reservation) -> frozenset[int]:
    if res.nodes:
        return frozenset(ix.id_of[n] for n in res.nodes if n in ix.id_of)
    if res.gpus <= 0:
        return frozenset(range(len(ix.nodes)))
    chosen = []
    gpus = 0
    for i in range(len(ix.nodes) - 1, -1, -1):
        if gpus >= res.gpus:
            break
        if ix.up[i]:
            chosen.append(i)
            gpus += ix.healthy[i].bit_count()
    return frozenset(chosen)


def off_limits(
    wins: list[Window], job: JobRequest, now: float
) -> tuple[frozenset[int], Window | None]:
    """Nodes the job must avoid to end before the windows it may not enter (and the first)."""
    end = now + job.time_limit_s
    avoid: set[int] = set()
    first = None
    for w in wins:
        if w.start < end and now < w.end and job.account not in w.accounts:
            avoid |= w.nodes
            if first is None or w.start < first.start:
                first = w
    return frozenset(avoid), first


def inside(wins: list[Window], job: JobRequest) -> Window | None:
    """The window a job asked to run in (JobRequest.reservation), if it exists."""
    return next((w for w in wins if w.name == job.reservation), None)
