"""Pure core, the future: when GPUs come free, and what is promised to whom.

Running jobs release their GPUs at their planned end (predict.py: the predicted
runtime, extended once outlived, never past started_at + time_limit_s; without a
prediction, the limit). Backfill reservations ("bookings") promise specific GPUs to a
blocked job from an estimated start until that start plus its planned runtime; nobody
else may plan on those GPUs inside that window. The same walk over releases, ordered by
cost instead of time, picks preemption victims.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from services.placer.core.index import ClusterIndex
from services.placer.core.select import CandidateView, IndexView

# node i may be used: a truthy answer (a bool, or a pool's membership byte: a builtin's
# __getitem__ asks without a Python frame, and the walks below ask it per release)
NodeOk = Callable[[int], int]

INSORT_MAX = 64  # releases added one by one into a sorted list; more: sorted on demand


class Release(NamedTuple):
    at: float  # a time, or a cost rank when choosing victims
    node: int
    mask: int
    job_id: int


class Booking(NamedTuple):
    job_id: int
    at: float  # reserved start
    until: float
    picks: tuple[tuple[int, int], ...]
    held: tuple[tuple[int, int], ...]  # the part free now, taken out of the index


class Future:
    """Releases of running (and just started) jobs, and bookings' promised GPUs."""

    def __init__(self, ix: ClusterIndex, later: Callable[[], list[Release]] | None = None) -> None:
        self.ix = ix
        self._releases: list[Release] = []
        self._sorted = False  # sorted on the first ask; small adds after keep it so
        # releases made only on the first ask (most passes book nothing): the list is
        # sorted as whole tuples, so when they join it changes nothing
        self._later = later
        self._promised: dict[int, list[tuple[int, float, float]]] = {}  # node: mask, from, to

    def add(self, at: float, picks: Sequence[tuple[int, int]], job_id: int) -> None:
        new = [Release(at, i, m, job_id) for i, m in picks if m]
        if self._sorted and len(new) <= INSORT_MAX:  # a start in a pass: keep the order
            for r in new:
                insort(self._releases, r)
        else:
            self._releases.extend(new)
            self._sorted = False

    def releases(self) -> list[Release]:
        if self._later is not None:
            self._releases += self._later()
            self._later = None
            self._sorted = False
        if not self._sorted:
            self._releases.sort()
            self._sorted = True
        return self._releases

    def promise(self, picks: Sequence[tuple[int, int]], start: float, until: float) -> None:
        for i, m in picks:
            self._promised.setdefault(i, []).append((m, start, until))

    def promised(self, i: int, start: float, end: float) -> int:
        """GPUs of node i promised to someone for part of [start, end)."""
        out = 0
        for m, a, b in self._promised.get(i, ()):
            if a < end and start < b:
                out |= m
        return out


class Need(NamedTuple):
    g: int  # GPUs per node
    nmin: int  # nodes
    duration: float  # the job's time limit: promises overlapping it are off limits
    start: float  # returned when the job fits without any release
    ranked: bool = False  # releases are ranked victims (all at `start`), not times
    whole: bool = False  # an exclusive job: a node counts only once all its GPUs are free


def earliest(
    ix: ClusterIndex,
    future: Future,
    now_view: IndexView,
    releases: Iterable[Release],
    need: Need,
    ok: NodeOk,
) -> tuple[float, CandidateView, dict[int, int]] | None:
    """The first release point at which nmin nodes have g usable GPUs, the view then, and
    what the releases alone add per node (to book GPUs busy now before free ones).

    With `need.whole` a node counts only once every healthy GPU on it is free and not
    promised (an exclusive job holds its nodes whole), and the view holds only those."""
    g, nmin, duration, start, ranked, whole = need
    now_set = [i for i in now_view.candidates(g) if ok(i)]
    if whole:
        now_set = [i for i in now_set if ix.jobs_on[i] == 0 and ix.free[i] == ix.healthy[i]]
    count = len(now_set)
    cur: dict[int, int] = {}
    when = start if count >= nmin else None
    up, free, avail, healthy = ix.up, ix.free, ix.avail, ix.healthy
    promises = future._promised  # only nodes in it have GPUs promised: ask those alone
    for r_at, i, mask, _ in releases if when is None else ():  # unpacked: no field reads
        if not up[i] or not ok(i):
            continue
        before = cur.get(i)
        if before is None:
            before = free[i] if avail[i] >= 0 else 0
        if i in promises:
            at = start if ranked else r_at
            after = before | (mask & healthy[i] & ~future.promised(i, at, at + duration))
        else:
            after = before | (mask & healthy[i])
        cur[i] = after
        if whole:
            count += after == healthy[i] != before and after.bit_count() >= g
        elif before.bit_count() < g <= after.bit_count():
            count += 1
        if count >= nmin:
            when = r_at
            break
    if when is None:
        return None
    masks = {i: ix.free[i] for i in now_set}
    masks.update(cur)
    if whole:
        masks = {i: m for i, m in masks.items() if m == ix.healthy[i]}
    return when, CandidateView(ix, masks, g), cur


def whole_nodes(ix: ClusterIndex, picks: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The picked nodes with every healthy GPU: what an exclusive job books or preempts."""
    return tuple((i, ix.healthy[i]) for i, _ in picks)


def earliest_leaf(
    ix: ClusterIndex,
    future: Future,
    now_view: IndexView,
    releases: Iterable[Release],
    need: Need,
    ok: NodeOk,
    horizon: float,
) -> tuple[float, int] | None:
    """The first release point up to `horizon` at which one leaf switch has nmin nodes
    with g usable GPUs, and that leaf; None if none does by then (see `earliest`)."""
    g, nmin, duration, start, _, whole = need
    leaf_of = ix.leaf_of
    counts: dict[int, int] = {}
    for i in now_view.candidates(g):
        if ok(i) and (not whole or (ix.jobs_on[i] == 0 and ix.free[i] == ix.healthy[i])):
            counts[leaf_of[i]] = counts.get(leaf_of[i], 0) + 1
    if counts and max(counts.values()) >= nmin:
        return start, min(d for d, c in counts.items() if c >= nmin)
    cur: dict[int, int] = {}
    promises = future._promised  # only nodes in it have GPUs promised: ask those alone
    for r in releases:
        if r.at > horizon:
            break
        i = r.node
        if not ix.up[i] or not ok(i):
            continue
        before = cur.get(i)
        if before is None:
            before = ix.free[i] if ix.avail[i] >= 0 else 0
        if i in promises:
            after = before | (r.mask & ix.healthy[i] & ~future.promised(i, r.at, r.at + duration))
        else:
            after = before | (r.mask & ix.healthy[i])
        cur[i] = after
        if whole:
            gained = after == ix.healthy[i] != before and after.bit_count() >= g
        else:
            gained = before.bit_count() < g <= after.bit_count()
        if gained:
            leaf = leaf_of[i]
            counts[leaf] = counts.get(leaf, 0) + 1
            if counts[leaf] >= nmin:
                return max(start, r.at), leaf
    return None
