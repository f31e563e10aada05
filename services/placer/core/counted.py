"""Pure core: `--constraint` feature counts (`a*2&b`) in gang selection.

A job's pool admits the nodes that have every uncounted feature of one alternative (`b`);
a counted term `a*2` asks that at least 2 of the job's nodes have `a`. As Slurm counts
them, each counted term is met by nodes of its own (`[r1*2&r2*4]` is six nodes).

Selection first takes the plain topology-aware choice (select_gang) and keeps it when it
meets every count. Otherwise it walks the domains as select_gang does (blocks, then
leaf switches, up to the whole cluster), tightest first, and in the first domain that
can meet the counts it reserves the counted nodes (the scarcest feature first; among
its nodes those with the fewest other counted features, then the fewest free GPUs),
then fills the rest of the gang inside the same domain. `earliest_counted` is the
booking's question (timeline.earliest) with the counts: when can they be met.

A GPU total (`--gpus=N` over any nodes) is steered the same way (`select_total_counted`):
the plain layout is kept when it meets the counts; otherwise, tightest domain first, the
nodes are taken widest first, a node joining when it meets one more counted slot (an
augmenting path) or while room is left beside the slots. That greedy is exact (the
basis of the matroid whose bases are such sets), so the counts are met whenever some
set of at most `max_nodes` nodes holds the total and meets them; a bisection on the set
size then takes the fewest nodes that do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from services.placer.core.index import ClusterIndex
from services.placer.core.pools import ROOT
from services.placer.core.select import (
    NO_TOPOLOGY,
    CandidateView,
    Chosen,
    IndexView,
    View,
    _chosen,
    pick_gpus,
    select_gang,
    select_total,
)
from services.placer.core.timeline import Future, Need, NodeOk, Release, earliest
from shared.constraint import Term

Counts = tuple[Term, ...]  # the counted terms of one alternative; () for none
NO_COUNTS = "no room for the --constraint counts"


def counted(alternative: Sequence[Term]) -> Counts:
    return tuple(t for t in alternative if t.count is not None)


def nodes_needed(counts: Counts) -> int:
    """The fewest nodes that can meet `counts` (each term's nodes its own)."""
    return sum(t.count or 0 for t in counts)


def meets(ix: ClusterIndex, nodes: Sequence[int], counts: Counts) -> bool:
    """Whether these node ids can meet every count, each term with nodes of its own."""
    return _assign(ix, list(nodes), counts, {}) is not None


def select_counted(
    ix: ClusterIndex,
    view: View,
    counts: Counts,
    nmin: int,
    nmax: int,
    g: int,
    max_leaves: int | None,
    pack: bool = False,
) -> Chosen | str:
    """select_gang, with `counts` met: nodes and GPUs for nmin..nmax nodes, or why not."""
    got = select_gang(ix, view, nmin, nmax, g, max_leaves, pack)
    if not counts or isinstance(got, str) or meets(ix, [i for i, _ in got.picks], counts):
        return got
    usable = {i: m for i in view.candidates(g) if (m := view.usable(i)) >= 0}
    usable = {i: m for i, m in usable.items() if m.bit_count() >= g}
    inside: dict[int, list[int]] = {}
    for i in sorted(usable):
        for d in ix.chain[i]:
            inside.setdefault(d, []).append(i)
    why = NO_COUNTS
    for level in [*ix.levels, [ROOT]]:
        fitting = [(len(inside[d]), d) for d in level if len(inside.get(d, ())) >= nmin]
        for _, d in sorted(fitting):
            nodes = _counted_set(ix, inside[d], usable, counts, nmin, nmax, g)
            if nodes is None:
                continue
            if max_leaves is not None and len({ix.leaf_of[i] for i in nodes}) > max_leaves:
                why = NO_TOPOLOGY
                continue
            picks = tuple((i, pick_gpus(ix, i, usable[i], g)) for i in sorted(nodes))
            return _chosen(ix, d, picks)
    return why


def select_total_counted(
    ix: ClusterIndex, view: View, total: int, max_nodes: int, counts: Counts
) -> Chosen | str:
    """select_total, with `counts` met: `total` GPUs over at most `max_nodes` nodes, each
    counted term on nodes of its own (every node of the job holds one GPU at least)."""
    got = select_total(ix, view, total, max_nodes)
    if not counts or (isinstance(got, Chosen) and meets(ix, [i for i, _ in got.picks], counts)):
        return got
    usable = {i: m for i in view.candidates(1) if (m := view.usable(i)) > 0}
    cap = min(max_nodes, total)
    if nodes_needed(counts) > cap:
        return NO_COUNTS
    sums: dict[int, int] = {}
    inside: dict[int, list[int]] = {}
    for i in sorted(usable):
        for d in ix.chain[i]:
            sums[d] = sums.get(d, 0) + usable[i].bit_count()
            inside.setdefault(d, []).append(i)
    if sums.get(ROOT, 0) < total:
        return got
    for level in [*ix.levels, [ROOT]]:
        for _, d in sorted((sums[d], d) for d in level if sums.get(d, 0) >= total):
            nodes = _fewest(ix, inside[d], usable, counts, total, cap)
            if nodes is not None:
                return _chosen(ix, d, tuple(sorted(_spread(ix, nodes, usable, total))))
    return NO_COUNTS


def _fewest(
    ix: ClusterIndex,
    nodes: list[int],
    usable: dict[int, int],
    counts: Counts,
    total: int,
    cap: int,
) -> list[int] | None:
    """The fewest of `nodes` (at most `cap`) holding `total` GPUs and meeting `counts`:
    whether `cap` nodes can is one greedy pass; the fewest is a bisection on that size
    (a set that does at m nodes still does with room for one more)."""
    wanted = {t.feature for t in counts}
    feats = {i: wanted.intersection(ix.nodes[i].features) for i in nodes}
    order = sorted(nodes, key=lambda i: (-usable[i].bit_count(), -len(feats[i]), i))
    terms = sorted(counts, key=lambda t: t.feature)
    slots = [t.feature for t in terms for _ in range(t.count or 0)]
    best = _total_set(order, usable, slots, feats, total, cap)
    if best is None:
        return None
    widest, lo = 0, 0
    while lo < len(order) and widest < total:
        widest += usable[order[lo]].bit_count()
        lo += 1
    lo, hi = max(lo, len(slots)), len(best)
    while lo < hi:
        mid = (lo + hi) // 2
        got = _total_set(order, usable, slots, feats, total, mid)
        if got is None:
            lo = mid + 1
        else:
            best, hi = got, len(got)
    return best


def _total_set(
    order: list[int],
    usable: dict[int, int],
    slots: list[str],
    feats: dict[int, set[str]],
    total: int,
    size: int,
) -> list[int] | None:
    """At most `size` nodes of `order` (widest first) holding `total` GPUs and meeting
    every slot, or None when no such set exists.

    A node joins when it meets one more counted slot (an augmenting path), or while
    fewer than `size` less the slots have joined without one: the greedy basis of the
    elongated transversal matroid, whose GPU sum is the largest any such set has. It
    stops once the slots are met and the GPUs are enough."""
    spare = size - len(slots)
    if spare < 0:
        return None
    owner: dict[int, int] = {}  # slot -> node
    chosen: list[int] = []
    gpus = 0
    for i in order:
        # a node joins when it fills one more counted slot (the matching grows), or
        # while there is room beside the slots
        fills = bool(feats[i]) and len(owner) < len(slots)
        if not (fills and _augment(i, slots, owner, feats, set())):
            if spare <= 0:
                continue
            spare -= 1
        chosen.append(i)
        gpus += usable[i].bit_count()
        if len(owner) == len(slots) and gpus >= total:
            return chosen
    return None


def _augment(
    i: int, slots: list[str], owner: dict[int, int], feats: dict[int, set[str]], seen: set[int]
) -> bool:
    """Node i takes a slot of its features: a free one, or one whose node moves on."""
    for s, f in enumerate(slots):
        if f in feats[i] and s not in seen:
            seen.add(s)
            held = owner.get(s)
            if held is None or _augment(held, slots, owner, feats, seen):
                owner[s] = i
                return True
    return False


def _spread(
    ix: ClusterIndex, nodes: list[int], usable: dict[int, int], total: int
) -> list[tuple[int, int]]:
    """`total` GPUs over `nodes` (widest first), one at least on each."""
    picks = []
    rest = total
    for k, i in enumerate(nodes):
        take = min(usable[i].bit_count(), rest - (len(nodes) - k - 1))
        picks.append((i, pick_gpus(ix, i, usable[i], take)))
        rest -= take
    return picks


def _counted_set(
    ix: ClusterIndex,
    nodes: list[int],
    usable: dict[int, int],
    counts: Counts,
    nmin: int,
    nmax: int,
    g: int,
) -> list[int] | None:
    """The counted nodes among `nodes`, then the rest of the gang from the others."""
    reserved = _assign(ix, nodes, counts, usable)
    if reserved is None or len(reserved) > nmax:
        return None
    taken = set(reserved)
    rest = {i: usable[i] for i in nodes if i not in taken}
    lo, hi = max(nmin - len(reserved), 0), nmax - len(reserved)
    if hi <= 0 or not rest:
        return reserved if lo == 0 else None
    fill = select_gang(ix, CandidateView(ix, rest, g), max(lo, 1), hi, g, None)
    if isinstance(fill, str):
        return reserved if lo == 0 else None
    return reserved + [i for i, _ in fill.picks]


def _assign(
    ix: ClusterIndex, nodes: list[int], counts: Counts, usable: dict[int, int]
) -> list[int] | None:
    """Distinct nodes meeting each count (one slot per counted node), or None: a
    bipartite matching of slots to nodes by augmenting paths, so it finds a way when
    one exists. Nodes are tried least wanted by the other counts first, then fullest
    (best fit); the scarcest feature's slots first."""
    feats = {i: set(ix.nodes[i].features) for i in nodes}
    wanted = {t.feature for t in counts}
    order = sorted(nodes, key=lambda i: (len(feats[i] & wanted), usable.get(i, 0).bit_count(), i))
    having = {f: [i for i in order if f in feats[i]] for f in wanted}
    terms = sorted(counts, key=lambda t: (len(having[t.feature]) - (t.count or 0), t.feature))
    slots = [t.feature for t in terms for _ in range(t.count or 0)]
    if any(len(having[f]) < slots.count(f) for f in wanted):
        return None
    owner: dict[int, int] = {}  # node -> the slot it meets

    def augment(slot: int, seen: set[int]) -> bool:
        for i in having[slots[slot]]:
            if i not in seen:
                seen.add(i)
                if i not in owner or augment(owner[i], seen):
                    owner[i] = slot
                    return True
        return False

    for slot in range(len(slots)):
        if not augment(slot, set()):
            return None
    return sorted(owner, key=owner.__getitem__)


def earliest_counted(
    ix: ClusterIndex,
    future: Future,
    now_view: IndexView,
    releases: Iterable[Release],
    need: Need,
    ok: NodeOk,
    counts: Counts,
) -> tuple[float, CandidateView, dict[int, int]] | None:
    """timeline.earliest, with `counts` met too: the first release point at which the
    usable nodes number nmin and can meet every count; the view then, and what the
    releases alone add per node."""
    if not counts:
        return earliest(ix, future, now_view, releases, need, ok)
    g, nmin, duration, start, ranked, whole = need
    masks = {
        i: ix.free[i]
        for i in now_view.candidates(g)
        if ok(i) and (not whole or (ix.jobs_on[i] == 0 and ix.free[i] == ix.healthy[i]))
    }
    enough = max(nmin, nodes_needed(counts))
    have = {t.feature: 0 for t in counts}  # usable nodes with each counted feature
    for i in masks:
        _count_in(ix, i, have)

    def fits() -> bool:  # the cheap counts first: the matching only once they hold
        if len(masks) < enough or any(have[t.feature] < (t.count or 0) for t in counts):
            return False
        return meets(ix, list(masks), counts)

    if fits():
        return start, CandidateView(ix, masks, g), {}
    cur: dict[int, int] = {}
    for r in releases:
        i = r.node
        if not ix.up[i] or not ok(i):
            continue
        before = cur.get(i, ix.free[i] if ix.avail[i] >= 0 else 0)
        at = start if ranked else r.at
        after = before | (r.mask & ix.healthy[i] & ~future.promised(i, at, at + duration))
        cur[i] = after
        if after == ix.healthy[i] if whole else after.bit_count() >= g:
            new = i not in masks
            masks[i] = after
            if new:
                _count_in(ix, i, have)
                if fits():
                    return r.at, CandidateView(ix, masks, g), cur
    return None


def _count_in(ix: ClusterIndex, i: int, have: dict[str, int]) -> None:
    for f in set(ix.nodes[i].features):
        if f in have:
            have[f] += 1
