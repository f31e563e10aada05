"""Pure core, preemption: which running jobs to stop so a higher tier can start.

Candidates are whole running jobs of a strictly lower tier, preemptible, past their
minimum runtime and not already promised to another preemptor. Taken in order of least
lost work (lowest priority, then least progress since start, then fewest GPUs), they are
freed one by one until the preemptor fits; it is then placed preferring GPUs already
free, and only the jobs whose GPUs it actually uses become victims. A strictly lower
tier can never preempt back, so there are no preemption cycles.

`Victims` holds what does not change in a pass: every running job's GPUs (node id,
mask) by job and by node, and the preemptible ones in cost order. A preemptor filters
that order (tier, taken, already leaving) and walks it lazily: the releases are made
only as far as the walk needs, and the victims are read off the chosen nodes alone.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from functools import cached_property

from services.placer.core.counted import Counts, earliest_counted, select_counted
from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest, Running
from services.placer.core.pools import Pool
from services.placer.core.select import IndexView, pick_gpus
from services.placer.core.shape import Shape
from services.placer.core.timeline import Future, Need, NodeOk, Release, whole_nodes

Picks = list[tuple[int, int]]  # (node id, GPU mask)


class Victims:
    """The running jobs of one prepared cluster, indexed for preemption."""

    def __init__(self, ix: ClusterIndex, running: Sequence[Running], now: float) -> None:
        self.running = running
        self.picks: list[Picks] = ix.running_gpus  # as the index took them
        self._on_node: dict[int, list[tuple[int, int]]] | None = None
        self._now = now
        self._order: list[int] | None = None
        self._rank: dict[int, int] = {}  # position: its place in `order`
        self._free_below: dict[int, list[int]] = {}  # tier: `order` below it, not leaving
        self._leaving: dict[int, list[int]] = {}  # preemptor: `order` leaving for it

    @cached_property
    def ids(self) -> list[int]:
        """The running jobs' ids by position (made when a preemptor first asks)."""
        return [r.job_id for r in self.running]

    @cached_property
    def unique(self) -> bool:
        return len(set(self.ids)) == len(self.running)

    def on_node(self, i: int) -> list[tuple[int, int]]:
        """(position, mask) of the running jobs' GPUs on node i, in running order."""
        if self._on_node is None:
            self._on_node = {}
            for p, picks in enumerate(self.picks):
                for n, m in picks:
                    self._on_node.setdefault(n, []).append((p, m))
        return self._on_node.get(i, [])

    def order(self) -> list[int]:
        """Positions of the preemptible jobs past their minimum runtime, cheapest first
        by the part of the cost that is the same for every preemptor (a stable sort of
        the running order, as `candidates` sorts)."""
        if self._order is None:
            now, run = self._now, self.running
            ok = [
                p
                for p, r in enumerate(run)
                if r.preemptible and now - r.started_at >= r.min_runtime_s
            ]
            ok.sort(
                key=lambda p: (
                    run[p].priority,
                    now - run[p].started_at,
                    sum(len(g.gpus) for g in run[p].grants),
                    run[p].job_id,
                )
            )
            self._order = ok
            self._rank = {p: k for k, p in enumerate(ok)}
            for p in ok:
                by = run[p].preempted_by
                if by is not None:
                    self._leaving.setdefault(by, []).append(p)
        return self._order

    def rank(self, p: int, me: int) -> tuple[bool, int]:
        """Where candidate p stands in `candidates(.., job)` for the job with id `me`."""
        return self.running[p].preempted_by != me, self._rank[p]

    def candidates(self, taken: Collection[int], job: JobRequest) -> list[int]:
        """Positions of the jobs `job` may preempt, cheapest first (see `candidates`)."""
        run, tier = self.running, job.tier
        order = self.order()
        below = self._free_below.get(tier)
        if below is None:
            below = self._free_below[tier] = [
                p for p in order if run[p].tier < tier and run[p].preempted_by is None
            ]
        ids = self.ids
        rest = [p for p in below if ids[p] not in taken] if taken else list(below)
        leaving = [  # already leaving for this job: free of cost
            p
            for p in self._leaving.get(job.job_id, ())
            if run[p].tier < tier and run[p].job_id not in taken
        ]
        return leaving + rest

    def releases(self, cands: list[int]) -> Iterator[Release]:
        """The candidates' GPUs as ranked releases, made as the walk reaches them."""
        run, picks = self.running, self.picks
        for rank, p in enumerate(cands):
            at, job_id = float(rank), run[p].job_id
            for i, m in picks[p]:
                yield Release(at, i, m, job_id)


def candidates(
    running: Sequence[Running], taken: Collection[int], job: JobRequest, now: float
) -> list[Running]:
    """Running jobs `job` may preempt, cheapest first; `taken` are already promised to
    an earlier preemptor of this pass."""
    found = [
        r
        for r in running
        if r.tier < job.tier
        and r.preemptible
        and r.job_id not in taken
        and now - r.started_at >= r.min_runtime_s
        and r.preempted_by in (None, job.job_id)
    ]
    found.sort(
        key=lambda r: (
            r.preempted_by != job.job_id,  # already leaving for this job: free of cost
            r.priority,
            now - r.started_at,
            sum(len(g.gpus) for g in r.grants),
            r.job_id,
        )
    )
    return found


def choose_victims(
    ix: ClusterIndex,
    future: Future,
    victims: Victims,
    cands: list[int],
    job: JobRequest,
    *,
    pool: Pool,
    shape: Shape,
    ok: NodeOk,
    now: float,
    runtime: int,
    counts: Counts = (),
) -> tuple[list[tuple[int, int]], list[Running]] | None:
    """The preemptor's GPUs (node id, mask) and the victims (among `cands`, positions in
    `victims.running`, cheapest first) that free them, or None. `ok` filters the nodes it
    may use; `runtime` is what the preemptor is planned to run (promises overlapping it
    are off limits); `counts`, the feature counts its nodes must meet (counted.py)."""
    if not cands:
        return None
    need = Need(shape.g, shape.nmin, runtime, now, ranked=True, whole=job.exclusive)
    releases = victims.releases(cands)
    found = earliest_counted(ix, future, IndexView(ix, pool), releases, need, ok, counts)
    if found is None:
        return None
    view = found[1]
    chosen = select_counted(ix, view, counts, shape.nmin, shape.nmin, shape.g, None)
    if isinstance(chosen, str):
        return None
    among = set(cands)
    me = job.job_id
    if job.exclusive:  # every job on its nodes goes, as for an explicit whole-node request
        picks = list(whole_nodes(ix, chosen.picks))
    else:
        picks = [
            (i, _prefer_free(ix, i, view.usable(i), _on(victims, among, me, i), shape.g))
            for i, _ in chosen.picks
        ]
    run = victims.running
    hit = {p for i, mask in picks for p, m in victims.on_node(i) if p in among and m & mask}
    if victims.unique:  # a job id names one position: the hit ones, in candidate order
        return picks, [run[p] for p in sorted(hit, key=lambda p: victims.rank(p, me))]
    ids = {run[p].job_id for p in hit}
    return picks, [run[p] for p in cands if run[p].job_id in ids]


def _on(victims: Victims, among: set[int], me: int, i: int) -> list[int]:
    """The candidates' masks on node i, in release order (cost rank, then grant order)."""
    on = victims.on_node(i)
    here = [(victims.rank(p, me), k, m) for k, (p, m) in enumerate(on) if p in among]
    here.sort()
    return [m for _, _, m in here]


def _prefer_free(ix: ClusterIndex, i: int, usable: int, masks: list[int], g: int) -> int:
    """g GPUs on node i: free ones first, then the cheapest victims' (masks are ranked)."""
    free_part = ix.free[i] & usable
    if free_part.bit_count() >= g:
        return pick_gpus(ix, i, free_part, g)
    mask = free_part
    for m in masks:
        extra = m & usable & ~mask
        while extra and mask.bit_count() < g:
            low = extra & -extra
            mask |= low
            extra ^= low
        if mask.bit_count() >= g:
            break
    return mask
