"""Pure core, placement of one gang on a view of usable GPUs.

Topology first: the job goes into the smallest domain (a block, then a leaf switch, then
each level up to the whole cluster) that can hold it whole, choosing the tightest such
domain (best fit, so large holes stay whole for large jobs). Inside it, nodes with the
fewest spare GPUs go first; inside a node, GPUs sharing one locality group.

A view says which GPUs a job may use: `IndexView` is the live index (fast, counts are
kept up to date), `CandidateView` is an explicit map (filtered nodes, future states).
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from services.placer.core.index import ClusterIndex
from services.placer.core.model import Fit
from services.placer.core.pools import ROOT, Pool


class Chosen(msgspec.Struct, frozen=True):
    picks: tuple[tuple[int, int], ...]  # (node id, GPU bitmask)
    fit: Fit
    domain: str = ""  # the block or switch of a BLOCK or SWITCH fit


class IndexView:
    """The index as it stands, limited to one pool."""

    __slots__ = ("ix", "pool")

    def __init__(self, ix: ClusterIndex, pool: Pool) -> None:
        self.ix = ix
        self.pool = pool

    def usable(self, i: int) -> int:
        return self.ix.free[i] if self.pool.member[i] and self.ix.avail[i] >= 0 else -1

    def count(self, d: int, g: int) -> int:
        return self.pool.ge[d][g] if g < len(self.pool.ge[d]) else 0

    def candidates(self, g: int) -> Iterator[int]:
        for bucket in self.pool.buckets[g:]:
            yield from bucket


class CandidateView:
    """An explicit set of usable nodes with their usable GPUs, counted for one size g."""

    __slots__ = ("counts", "g", "masks")

    def __init__(self, ix: ClusterIndex, masks: dict[int, int], g: int) -> None:
        self.g = g
        self.masks = {i: m for i, m in masks.items() if m.bit_count() >= g}
        counts: dict[int, int] = {}
        for i in self.masks:
            for d in ix.chain[i]:
                counts[d] = counts.get(d, 0) + 1
        self.counts = counts

    def usable(self, i: int) -> int:
        return self.masks.get(i, -1)

    def count(self, d: int, g: int) -> int:
        return self.counts.get(d, 0)

    def candidates(self, g: int) -> Iterator[int]:
        return iter(sorted(self.masks))


View = IndexView | CandidateView

NO_ROOM = "no room"
NO_TOPOLOGY = "no room within the switch limit"


def select_gang(
    ix: ClusterIndex,
    view: View,
    nmin: int,
    nmax: int,
    g: int,
    max_leaves: int | None,
    pack: bool = False,
) -> Chosen | str:
    """Nodes and GPUs for nmin..nmax nodes of g GPUs each, or why not.

    `pack`: a one-node job is placed by the fragmentation score (`packed_leaf`)."""
    n = min(nmax, view.count(ROOT, g))
    if n < nmin:
        return NO_ROOM
    if pack and n == 1 and max_leaves is None and isinstance(view, IndexView):
        leaf = packed_leaf(ix, view.pool, g)
        if leaf is not None:
            nodes = _take_nodes(ix, view, leaf, 1, g)
            picks = tuple((i, pick_gpus(ix, i, view.usable(i), g)) for i in nodes)
            return _chosen(ix, leaf, picks)
    if max_leaves is not None:
        tops = sorted((view.count(leaf, g) for leaf in ix.leaves), reverse=True)
        n = min(n, sum(tops[:max_leaves]))
        if n < nmin:
            return NO_TOPOLOGY
    d = _choose_domain(ix, view, n, g)
    nodes = _take_nodes(ix, view, d, n, g)
    if max_leaves is not None and len({ix.leaf_of[i] for i in nodes}) > max_leaves:
        return NO_TOPOLOGY
    picks = tuple((i, pick_gpus(ix, i, view.usable(i), g)) for i in sorted(nodes))
    return _chosen(ix, d, picks)


def packed_leaf(ix: ClusterIndex, pool: Pool, g: int) -> int | None:
    """The leaf for a one-node job of g GPUs by the fragmentation score, or None.

    Score, lowest first: (free GPUs on the best node that holds the job, whole free nodes
    in its leaf, leaf number). The first term is best fit over the whole pool, so a whole
    node is broken only when no partly used node holds the job; the second breaks ties
    toward the leaf a gang could use least (HiveD's buddy cells, FGD's "least
    fragmentation" in one explainable number). None without leaves (blocks are left to
    the plain tightest-domain rule) or when nothing fits."""
    if g < 1 or not ix.levels or ix.levels[0][0] not in ix.leaves:
        return None
    ge, width = pool.ge, len(pool.ge[ROOT]) - 1
    top = ge[ROOT]
    a = next((k for k in range(g, width + 1) if top[k] - (top[k + 1] if k < width else 0)), -1)
    if a < 0:
        return None
    exact = pool.buckets[a]  # the pool's nodes with exactly `a` free GPUs
    if len(exact) < len(ix.leaves):  # their leaves, found from the nodes
        leaf_of = ix.leaf_of
        return min((ge[leaf][width], leaf) for leaf in {leaf_of[i] for i in exact})[1]
    if a < width:  # the leaves holding one, found from the leaves' counts
        fits = [(ge[leaf][width], leaf) for leaf in ix.leaves if ge[leaf][a] > ge[leaf][a + 1]]
    else:
        fits = [(ge[leaf][width], leaf) for leaf in ix.leaves if ge[leaf][a] > 0]
    return min(fits)[1] if fits else None


def _choose_domain(ix: ClusterIndex, view: View, n: int, g: int) -> int:
    """The tightest domain of the lowest level with n nodes of g GPUs (the first of
    equals), else the root. The counts are read straight from the view."""
    for level in ix.levels:
        col = _level_counts(view, level, g)
        tight = min((c for c in col if c >= n), default=-1)
        if tight >= 0:
            return level[col.index(tight)]
    return ROOT


def _level_counts(view: View, level: list[int], g: int) -> list[int]:
    """How many nodes of each domain of one level have g GPUs free, read from the view."""
    if isinstance(view, CandidateView):
        counts = view.counts
        return [counts.get(d, 0) for d in level]
    ge = view.pool.ge
    if g < len(ge[ROOT]):
        return [ge[d][g] for d in level]
    return [view.count(d, g) for d in level]


def _take_nodes(ix: ClusterIndex, view: View, d: int, n: int, g: int) -> list[int]:
    if type(view) is IndexView and g < len(view.pool.ge[ROOT]):  # the counts, read direct
        ge = view.pool.ge
        kids = [(ge[k][g], k) for k in ix.kids[d]]
    else:
        kids = [(view.count(k, g), k) for k in ix.kids[d]]
    kids = sorted(((c, k) for c, k in kids if c > 0), key=lambda ck: (-ck[0], ck[1]))
    fitting = [ck for ck in kids if ck[0] >= n]
    if fitting:
        return _take_nodes(ix, view, min(fitting)[1], n, g)
    if type(view) is IndexView:  # a node's usable count is its avail (free, or -1)
        avail, member = ix.avail, view.pool.member
        direct = sorted((avail[i], i) for i in ix.direct[d] if member[i] and avail[i] >= g)
        if g < 0:  # kept as the general path keeps it: every usable node
            direct = [(a, i) for a, i in direct if a >= 0]
    else:
        direct = sorted((u.bit_count(), i) for i in ix.direct[d] if (u := view.usable(i)) >= 0)
        direct = [(a, i) for a, i in direct if a >= g]
    if len(direct) >= n or not kids:
        return [i for _, i in direct[:n]]
    taken: list[int] = []
    rest = n
    for pos, (c, k) in enumerate(kids):
        if rest == 0:
            break
        if c >= rest:
            best = min(ck for ck in kids[pos:] if ck[0] >= rest)
            taken += _take_nodes(ix, view, best[1], rest, g)
            rest = 0
            break
        taken += _take_nodes(ix, view, k, c, g)
        rest -= c
    return taken + [i for _, i in direct[:rest]]


_PICKED: dict[tuple[tuple[int, ...], int, int], int] = {}  # (groups, usable, g): GPUs


def pick_gpus(ix: ClusterIndex, i: int, usable: int, g: int) -> int:
    """g GPUs from `usable`, inside one locality group if one has room (the tightest)."""
    if g <= 0:
        return 0
    key = (ix.groups[i], usable, g)
    got = _PICKED.get(key)
    if got is None:
        if len(_PICKED) >= 65_536:
            _PICKED.clear()
        got = _PICKED[key] = _pick_gpus(key[0], usable, g)
    return got


def _pick_gpus(node_groups: tuple[int, ...], usable: int, g: int) -> int:
    groups = [m & usable for m in node_groups]
    fitting = [(m.bit_count(), m) for m in groups if m.bit_count() >= g]
    if fitting:
        return _lowest_bits(min(fitting)[1], g)
    out = 0
    rest = g
    for m in sorted(groups, key=lambda m: -m.bit_count()):
        part = _lowest_bits(m, min(rest, m.bit_count()))
        out |= part
        rest -= part.bit_count()
        if rest == 0:
            break
    return out


def _lowest_bits(mask: int, k: int) -> int:
    out = 0
    for _ in range(k):
        low = mask & -mask
        out |= low
        mask ^= low
    return out


def select_total(ix: ClusterIndex, view: View, total: int, max_nodes: int) -> Chosen | str:
    """A free-form layout of `total` GPUs over as few nodes as possible (gpus_total)."""
    if type(view) is IndexView:
        return _index_total(ix, view, total, max_nodes)
    usable = {i: view.usable(i) for i in view.candidates(1)}
    if sum(m.bit_count() for m in usable.values()) < total:
        return NO_ROOM
    sums: dict[int, int] = {}
    for i, m in usable.items():
        for d in ix.chain[i]:
            sums[d] = sums.get(d, 0) + m.bit_count()
    d = ROOT
    for level in ix.levels:
        fits = [(sums[x], x) for x in level if sums.get(x, 0) >= total]
        if fits:
            d = min(fits)[1]
            break
    got = _lay_out(ix, usable, d, total, max_nodes)
    if got is None and d != ROOT:  # too fragmented there for max_nodes: the fewest anywhere
        got = _lay_out(ix, usable, ROOT, total, max_nodes)
        d = ROOT
    return NO_ROOM if got is None else _chosen(ix, d, got)


def _index_total(ix: ClusterIndex, view: IndexView, total: int, max_nodes: int) -> Chosen | str:
    """select_total on the live index: a domain's free GPUs are its count row's sum (a
    node with k free counts in rows 1..k), and only the chosen domain's nodes are read."""
    ge, avail, member, free = view.pool.ge, ix.avail, view.pool.member, ix.free
    if sum(ge[ROOT]) - ge[ROOT][0] < total:
        return NO_ROOM
    d = ROOT
    for level in ix.levels:
        fits = [(c, x) for x in level if (c := sum(ge[x]) - ge[x][0]) >= total]
        if fits:
            d = min(fits)[1]
            break
    usable = {i: free[i] for i in ix.under(d) if member[i] and avail[i] >= 1}
    got = _lay_out(ix, usable, d, total, max_nodes)
    if got is None and d != ROOT:  # too fragmented there for max_nodes: the fewest anywhere
        usable = {i: free[i] for i in ix.under(ROOT) if member[i] and avail[i] >= 1}
        got = _lay_out(ix, usable, ROOT, total, max_nodes)
        d = ROOT
    return NO_ROOM if got is None else _chosen(ix, d, got)


def _lay_out(
    ix: ClusterIndex, usable: dict[int, int], d: int, total: int, max_nodes: int
) -> tuple[tuple[int, int], ...] | None:
    """`total` GPUs on the nodes of domain d, best fit for the last: the widest nodes
    until one holds the rest, so the fewest nodes d has; None past `max_nodes`."""
    inside = sorted(((m.bit_count(), i) for i, m in usable.items() if d in ix.chain[i]))
    picks: list[tuple[int, int]] = []
    rest = total
    while rest > 0 and inside:
        fit = next(((a, i) for a, i in inside if a >= rest), None)
        if fit is None:  # none holds the rest: the widest, lowest-numbered first
            fit = max(inside, key=lambda ai: (ai[0], -ai[1]))
        inside.remove(fit)
        take = min(rest, fit[0])
        picks.append((fit[1], pick_gpus(ix, fit[1], usable[fit[1]], take)))
        rest -= take
    if rest > 0 or len(picks) > max_nodes:
        return None
    return tuple(sorted(picks))


def _chosen(ix: ClusterIndex, d: int, picks: tuple[tuple[int, int], ...]) -> Chosen:
    """The picks with how they fit: one node, a block or switch (domain d), or spread."""
    if len(picks) == 1:
        i, mask = picks[0]
        groups = sum(1 for m in ix.groups[i] if m & mask)
        return Chosen(picks, Fit.NODE if groups <= 1 else Fit.NODE_SPLIT)
    if not ix.levels or ix.levels == [[ROOT]]:
        return Chosen(picks, Fit.FLAT)
    if d == ROOT:
        return Chosen(picks, Fit.ACROSS_SWITCHES)
    fit = Fit.BLOCK if ix.depth[d] < 0 else Fit.SWITCH
    return Chosen(picks, fit, ix.domain_name[d])
