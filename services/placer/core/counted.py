"""Pure core: `--constraint` feature counts (`a*2&b`) in gang selection.

A job's pool admits the nodes that have every uncounted feature of one alternative (`b`);
a counted term `a*2` asks that at least 2 of the job's nodes have `a`. As Slurm counts
them, each counted term is met by nodes of its own (`[r1*2&r2*4]` is six nodes).

Selection first takes the plain topology-aware choice (select_gang) and keeps it when it
meets every count. Otherwise it walks the domains as select_gang does (blocks, then
leaf switches, up to the whole cluster), tightest first, and in the first domain that
can meet the counts it reserves the counted nodes (the scarcest feature first; among
its nodes those with the fewest other counted features, then the fewest free GPUs),
then fills the rest of the gang inside the same domain.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.index import ROOT, ClusterIndex
from services.placer.core.select import (
    NO_TOPOLOGY,
    CandidateView,
    Chosen,
    View,
    _chosen,
    pick_gpus,
    select_gang,
)
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
    """Distinct nodes meeting each count, greedily: the scarcest feature first, and for
    it the nodes least wanted by the other counts, then the fullest (best fit)."""
    feats = {i: set(ix.nodes[i].features) for i in nodes}
    wanted = {t.feature for t in counts}
    having = {t: [i for i in nodes if t.feature in feats[i]] for t in counts}
    chosen: list[int] = []
    taken: set[int] = set()
    for t in sorted(counts, key=lambda t: (len(having[t]) - (t.count or 0), t.feature)):
        free = [i for i in having[t] if i not in taken]
        free.sort(key=lambda i: (len(feats[i] & wanted), usable.get(i, 0).bit_count(), i))
        need = t.count or 0
        if len(free) < need:
            return None
        chosen += free[:need]
        taken.update(free[:need])
    return chosen
