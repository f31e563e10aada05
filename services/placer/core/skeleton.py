"""Pure core: what one tuple of nodes fixes, kept between passes over the same nodes.

Nodes are numbered in topology order (path, then name), so low numbers pack one switch;
the skeleton holds per node its GPU bits, locality groups, health and domain chain, the
topology domains by level, which nodes each pool key admits (`Members`), the running
jobs' grants resolved to (node id, mask), and the last pass's marking (marked.py). A
pass over the very same node objects (the simulator between node events, a service
between node changes) reuses all of it; the index (index.py) is built on top each pass.
"""

from __future__ import annotations

from functools import lru_cache
from operator import is_

from services.placer.core.marked import Marked
from services.placer.core.model import Grant, Node
from services.placer.core.pools import ROOT, PoolKey
from shared.constraint import Constraint, Term, node_fits, parse
from shared.gpu_types import gpu_matches, type_of
from shared.states import NodeState


class Skeleton:
    """What one tuple of nodes fixes: numbering, GPU bits, locality groups, domains.

    Cached per distinct nodes tuple (see `skeleton`), so passes over an unchanged
    cluster (the simulator, a service between node events) skip rebuilding it.
    """

    def __init__(self, given: tuple[Node, ...]) -> None:
        nodes = sorted(given, key=lambda n: (n.topology, n.block or "", n.name))
        self.nodes: list[Node] = nodes
        self.id_of = {n.name: i for i, n in enumerate(nodes)}
        self.width = max((len(n.gpus) for n in nodes), default=0)
        self.up = bytearray(n.state is NodeState.UP for n in nodes)
        # nodes a fabric fault keeps out of multi-node jobs (core/fabric.py)
        self.multi_node_excluded = tuple(i for i, n in enumerate(nodes) if n.multi_node_excluded)
        self._build_gpus(nodes)
        self._build_domains(nodes)

    def _build_gpus(self, nodes: list[Node]) -> None:
        self.bit_to_gpu: list[tuple[int, ...]] = []
        self.groups: list[tuple[int, ...]] = []
        self.healthy: list[int] = []
        self.plain_bits: list[bool] = []  # Gpu.index == bit position: masks are direct
        self.model: list[str | None] = []
        self.gpu_type: list[str | None] = []
        for n in nodes:
            self.bit_to_gpu.append(tuple(g.index for g in n.gpus))
            self.plain_bits.append(self.bit_to_gpu[-1] == tuple(range(len(n.gpus))))
            by_locality: dict[int, int] = {}
            healthy = 0
            for bit, g in enumerate(n.gpus):
                if g.healthy:
                    healthy |= 1 << bit
                    by_locality[g.locality] = by_locality.get(g.locality, 0) | 1 << bit
            self.groups.append(tuple(by_locality[k] for k in sorted(by_locality)))
            self.healthy.append(healthy)
            self.model.append(n.gpus[0].model if n.gpus else None)
            self.gpu_type.append(type_of(self.model[-1], n.gpu_type) if n.gpus else None)

    def _build_domains(self, nodes: list[Node]) -> None:
        ids: dict[tuple[str, ...], int] = {(): ROOT}
        self.domain_name: list[str] = ["cluster"]
        self.kids: list[list[int]] = [[]]
        self.direct: list[list[int]] = [[]]
        self.depth: list[int] = [0]
        self.chain: list[tuple[int, ...]] = []
        self.leaf_of: list[int] = []
        for i, n in enumerate(nodes):
            chain = [ROOT]
            path = tuple(n.topology)
            for depth in range(1, len(path) + 1):
                chain.append(self._domain(ids, path[:depth], path[depth - 1], chain[-1], depth))
            self.direct[chain[-1]].append(i)
            self.leaf_of.append(chain[-1])
            if n.block is not None:
                key = ("\0block", n.block)
                block = self._domain(ids, key, n.block, -1, -1)
                self.direct[block].append(i)
                chain.append(block)
            self.chain.append(tuple(chain))
        self.levels = self._levels()
        self._under: dict[int, list[int]] = {}  # domain: its nodes, made when first asked
        # free GPUs a node takes work on, with nothing running (-1: it takes none)
        self.avail = [
            h.bit_count() if u else -1 for h, u in zip(self.healthy, self.up, strict=True)
        ]
        # a running job's grant: (node id, GPU mask), None for a node not here (see `taken`)
        self.grants: dict[Grant, tuple[int, int] | None] = {}
        self._members: dict[PoolKey, Members] = {}
        self.marked: Marked | None = None  # the last pass's running jobs, marked
        self.leaves = sorted(set(self.leaf_of))
        self.widest_leaf = max((len(self.direct[d]) for d in self.leaves), default=0)

    def _domain(
        self, ids: dict[tuple[str, ...], int], key: tuple[str, ...], name: str, up: int, depth: int
    ) -> int:
        found = ids.get(key)
        if found is not None:
            return found
        d = ids[key] = len(self.domain_name)
        self.domain_name.append(name)
        self.kids.append([])
        self.direct.append([])
        self.depth.append(depth)
        if up >= 0:
            self.kids[up].append(d)
        return d

    def members(self, key: PoolKey) -> Members:
        """The nodes a pool key admits, whatever their state now (cached)."""
        found = self._members.get(key)
        if found is None:
            found = self._members[key] = Members(self, key)
        return found

    def nodes_under(self, d: int) -> list[int]:
        """The nodes of domain d (those with d on their chain), in node order."""
        found = self._under.get(d)
        if found is None:
            found = list(self.direct[d])
            for k in self.kids[d]:
                found += self.nodes_under(k)
            found.sort()
            self._under[d] = found
        return found

    def _levels(self) -> list[list[int]]:
        """Domains grouped by level, smallest first: blocks, deepest switches ... root."""
        deepest = max(self.depth)
        levels = [[d for d, dep in enumerate(self.depth) if dep == -1]]
        levels += [
            [d for d, dep in enumerate(self.depth) if dep == level]
            for level in range(deepest, 0, -1)
        ]
        return [level for level in levels if level]


class Members:
    """The nodes of one pool key on one skeleton: what does not change with the load."""

    __slots__ = ("facts", "nodes")

    def __init__(self, sk: Skeleton, key: PoolKey) -> None:
        partition, model, constraint, multi_node = key
        wanted = parse_constraint(constraint) if constraint else None
        member = bytearray(len(sk.nodes))
        nodes: list[int] = []
        up = widest = gpus = 0
        for i, n in enumerate(sk.nodes):
            if n.partitions and partition not in n.partitions:
                continue
            if model is not None and not gpu_matches(model, sk.model[i], sk.gpu_type[i]):
                continue
            if wanted is not None and not node_fits(n.features, wanted):
                continue
            if multi_node and n.multi_node_excluded:
                continue  # its fabric carries no collectives now (placer/core/fabric.py)
            member[i] = 1
            nodes.append(i)
            up += n.state is NodeState.UP
            widest = max(widest, sk.healthy[i].bit_count())
            gpus += sk.healthy[i].bit_count()
        self.nodes = nodes
        # Pool's member (shared, read only), size, up, widest and gpus
        self.facts = (member, len(nodes), up, widest, gpus)


@lru_cache(maxsize=256)
def parse_constraint(text: str) -> Constraint:
    """A constraint admission accepted; one that does not parse matches no node."""
    try:
        return parse(text)
    except ValueError:
        return Constraint(alternatives=((Term("\0unparsable"),),))


def skeleton(nodes: tuple[Node, ...]) -> Skeleton:
    """The skeleton of these nodes: the last one's if they are the very same node objects
    (no hashing of every node: the simulator's passes between node events), else cached."""
    last = _LAST[0]
    if last is not None:
        seen, sk = last
        if seen is nodes or (len(seen) == len(nodes) and all(map(is_, seen, nodes))):
            return sk
    sk = _skeleton(nodes)
    _LAST[0] = (nodes, sk)
    return sk


@lru_cache(maxsize=4)
def _skeleton(nodes: tuple[Node, ...]) -> Skeleton:
    return Skeleton(nodes)


_LAST: list[tuple[tuple[Node, ...], Skeleton] | None] = [None]
