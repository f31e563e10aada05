"""Pure core, working state: a mutable index of free GPUs built from one Snapshot.

The index exists for the length of one pass (or one prepared cluster, see `prepare`). It
keeps what placement asks for constantly in O(1):

- per node: a bitmask of free healthy GPUs and `avail` (their count, -1 if the node takes
  no new work: not UP, or held whole by an exclusive job);
- per pool (nodes serving one partition with one GPU type or model, and fitting one
  `--constraint`) and per topology domain
  (root, every switch, every block): `ge[domain][k]`, how many pool nodes have >= k GPUs
  free, updated on every take and release along the node's short domain chain;
- per pool: nodes bucketed by free count, each bucket a sorted list, for best fit.

Nodes are numbered in topology order (path, then name), so low numbers pack one switch.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable
from functools import lru_cache
from operator import is_
from typing import Any

from services.placer.core.model import Grant, Node, Running, Snapshot
from shared.constraint import Constraint, Term, node_fits, parse
from shared.gpu_types import gpu_matches, type_of
from shared.states import NodeState

ROOT = 0
# (node width, Gpu.index values) -> bitmask, on nodes whose bits are the indexes
_PLAIN_MASKS: dict[tuple[int, tuple[int, ...]], int] = {}
_GPUS_OF: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}  # the reverse
# (partition, the GPU type or model asked for, a --constraint without [..]; None: any,
# multi-node: the nodes a fabric fault keeps out of multi-node jobs left out).
PoolKey = tuple[str, str | None, str | None, bool]
# a running job's releases (timeline.Release tuples), made at a time `from`, good for
# any now in [from, until) with the same use_predictions: (from, until, use, releases)
Ends = tuple[float, float, bool, list[Any]]


class Pool:
    """The nodes one (partition, GPU type, constraint) can use, with counts per domain."""

    __slots__ = ("buckets", "ge", "gpus", "key", "member", "size", "together", "up", "widest")

    def __init__(self, key: PoolKey, n_nodes: int, n_domains: int, width: int):
        self.key = key
        self.member = bytearray(n_nodes)
        self.ge = [[0] * (width + 1) for _ in range(n_domains)]
        self.buckets: list[list[int]] = [[] for _ in range(width + 1)]
        self.size = 0  # member nodes, any state
        self.up = 0  # member nodes UP
        self.widest = 0  # most healthy GPUs on one member node
        self.gpus = 0  # healthy GPUs on member nodes
        # (feature counts, nodes) -> whether member nodes can meet them (shape.precheck)
        self.together: dict[tuple[tuple[Term, ...], int], bool] = {}

    def copy(self) -> Pool:
        """The same counts in lists of its own (`together` starts empty, as a new pool's)."""
        out = Pool.__new__(Pool)
        out.key, out.member, out.size, out.up = self.key, self.member, self.size, self.up
        out.widest, out.gpus = self.widest, self.gpus
        out.ge = [row[:] for row in self.ge]
        out.buckets = [b[:] for b in self.buckets]
        out.together = {}
        return out

    def move(self, chain: tuple[int, ...], i: int, old: int, new: int) -> None:
        """Member node i's free count (`avail`) goes from old to new (-1: takes none)."""
        if old >= 0:
            bucket = self.buckets[old]
            del bucket[bisect_left(bucket, i)]
        if new >= 0:
            insort(self.buckets[new], i)
        lo, hi, step = (old + 1, new + 1, 1) if new > old else (new + 1, old + 1, -1)
        ge = self.ge
        if hi - lo == 1:  # one GPU more or less: one count per domain
            for d in chain:
                ge[d][lo] += step
            return
        for d in chain:
            row = ge[d]
            for k in range(lo, hi):
                row[k] += step


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


class ClusterIndex:
    """Free GPUs by node, pool and domain. Mutated only through take/give/hold_node."""

    def __init__(self, snapshot: Snapshot) -> None:
        sk = skeleton(snapshot.nodes)
        self.nodes = sk.nodes
        self.id_of = sk.id_of
        self.width = sk.width
        self.up = sk.up
        self.multi_node_excluded = sk.multi_node_excluded
        self.bit_to_gpu = sk.bit_to_gpu
        self.plain_bits = sk.plain_bits
        self.groups = sk.groups
        self.healthy = sk.healthy
        self.model = sk.model
        self.gpu_type = sk.gpu_type
        self.domain_name = sk.domain_name
        self.kids = sk.kids
        self.direct = sk.direct
        self.depth = sk.depth
        self.chain = sk.chain
        self.leaf_of = sk.leaf_of
        self.levels = sk.levels
        self.leaves = sk.leaves
        self.widest_leaf = sk.widest_leaf
        self.under = sk.nodes_under
        self.members = sk.members
        self._sk = sk
        self.pools: dict[PoolKey, Pool] = {}
        self._grants = sk.grants
        self._mark_running(snapshot)

    def _mark_running(self, snapshot: Snapshot) -> None:
        """Take the running jobs' GPUs; `running_gpus[k]`: running job k's (node id, mask) pairs.

        What the previous pass over these nodes marked is kept with the skeleton
        (`Marked`): a pass whose running jobs are mostly the same objects redoes only
        the nodes of the jobs that came or went. Free GPUs, jobs per node and `avail`
        depend only on the set of jobs on a node, not their order, so that is exact."""
        sk, running = self._sk, snapshot.running
        last, sk.marked = sk.marked, None  # taken while in use: a reentrant pass rebuilds
        got = None if last is None else last.redo(self, running)
        if got is None:
            got = Marked(self, running)
        self.free, self.avail, self.jobs_on = list(got.free), list(got.avail), list(got.jobs_on)
        self.running_gpus = got.gpus_of(running)
        self.marked = got  # held: its jobs (and so their ids) stay alive with the index
        self._version = got.version
        self._moved: set[int] = set()  # nodes whose avail changed since
        if got.unique:
            sk.marked = got

    # --- pools ----------------------------------------------------------------------------

    def pool(
        self,
        partition: str,
        model: str | None,
        constraint: str | None = None,
        multi_node: bool = False,
    ) -> Pool:
        key = (partition, model, constraint, multi_node)
        found = self.pools.get(key)
        if found is None:
            found = self.pools[key] = self._new_pool(key)
        return found

    def _new_pool(self, key: PoolKey) -> Pool:
        """The pool's counts over `avail` now: a copy of the marking's pool (its counts
        over the avail the pass began with), moved for the nodes changed since."""
        marked = self.marked
        if marked.version != self._version:  # the marking moved on to a later pass
            return self._build_pool(key, self.avail)
        base = marked.pools.get(key)
        if base is None:
            base = marked.pools[key] = self._build_pool(key, marked.avail)
        pool = base.copy()
        if self._moved:
            was, avail, chain, member = marked.avail, self.avail, self.chain, pool.member
            for i in sorted(self._moved):
                if member[i] and was[i] != avail[i]:
                    pool.move(chain[i], i, was[i], avail[i])
        return pool

    def _build_pool(self, key: PoolKey, avail: list[int]) -> Pool:
        pool = Pool(key, len(self.nodes), len(self.domain_name), self.width)
        members = self.members(key)
        pool.member, pool.size, pool.up, pool.widest, pool.gpus = members.facts
        chain, buckets, ge = self.chain, pool.buckets, pool.ge
        for i in members.nodes:
            a = avail[i]
            if a >= 0:
                buckets[a].append(i)
                for d in chain[i]:
                    ge[d][a] += 1  # a histogram for now, summed from the top below
        for row in pool.ge:
            for k in range(self.width - 1, -1, -1):
                row[k] += row[k + 1]
        return pool

    def pools_of(self, i: int) -> list[Pool]:
        return [p for p in self.pools.values() if p.member[i]]

    # --- changes --------------------------------------------------------------------------

    def taken(self, grant: Grant) -> tuple[int, int] | None:
        """A grant's (node id, GPU mask), kept with the skeleton: passes over the same
        nodes see mostly the same running jobs."""
        grants = self._grants
        try:
            return grants[grant]
        except KeyError:
            got = self._taken(grant)
        except TypeError:  # GPU indexes built as a list, not a tuple: not kept
            return self._taken(grant)
        if len(grants) >= 262_144:
            grants.clear()
        grants[grant] = got
        return got

    def _taken(self, grant: Grant) -> tuple[int, int] | None:
        i = self.id_of.get(grant.node)
        return None if i is None else (i, self.mask_of(i, tuple(grant.gpus)))

    def mask_of(self, i: int, gpu_indexes: tuple[int, ...]) -> int:
        if self.plain_bits[i]:
            key = (len(self.bit_to_gpu[i]), gpu_indexes)
            mask = _PLAIN_MASKS.get(key)
            if mask is None:
                if len(_PLAIN_MASKS) >= 65_536:
                    _PLAIN_MASKS.clear()
                width = key[0]
                mask = _PLAIN_MASKS[key] = sum(1 << g for g in gpu_indexes if 0 <= g < width)
            return mask
        bits = self.bit_to_gpu[i]
        mask = 0
        for g in gpu_indexes:
            if g in bits:
                mask |= 1 << bits.index(g)
        return mask

    def gpus_of(self, i: int, mask: int) -> tuple[int, ...]:
        bits = self.bit_to_gpu[i]
        key = (bits, mask)
        got = _GPUS_OF.get(key)
        if got is None:
            if len(_GPUS_OF) >= 65_536:
                _GPUS_OF.clear()
            got = _GPUS_OF[key] = tuple(bits[b] for b in range(len(bits)) if mask >> b & 1)
        return got

    def take(self, i: int, mask: int) -> None:
        """Mark GPUs busy (a start, or held for a reservation or a preemptor)."""
        self.free[i] &= ~mask
        if self.avail[i] >= 0:
            self._set_avail(i, self.free[i].bit_count())

    def give(self, i: int, mask: int) -> None:
        """Undo a take (a reservation hold lent to a job that ends in time)."""
        self.free[i] |= mask & self.healthy[i]
        if self.avail[i] >= 0:
            self._set_avail(i, self.free[i].bit_count())

    def hold_node(self, i: int) -> None:
        """An exclusive job holds the whole node: nothing else goes there."""
        self._set_avail(i, -1)

    def _set_avail(self, i: int, new: int) -> None:
        old = self.avail[i]
        if new == old:
            return
        self.avail[i] = new
        self._moved.add(i)
        chain = self.chain[i]
        for pool in self.pools.values():
            if pool.member[i]:
                pool.move(chain, i, old, new)


class Marked:
    """The running jobs of one pass marked on a skeleton: free GPUs, jobs and `avail` per
    node, each job's (node id, mask) pairs by the job's identity, and per node the jobs
    on it. Kept for the next pass (`redo`), which changes only the nodes touched."""

    __slots__ = (
        "avail",
        "by_id",
        "ends",
        "free",
        "jobs_on",
        "on_node",
        "pools",
        "running",
        "unique",
        "version",
    )

    def __init__(self, ix: ClusterIndex, running: tuple[Running, ...]) -> None:
        sk = ix._sk
        self.running = running  # kept alive: the ids below stay theirs
        self.free = list(sk.healthy)
        self.avail = list(sk.avail)
        self.jobs_on = [0] * len(sk.nodes)
        self.by_id: dict[int, list[tuple[int, int]]] = {}
        self.ends: dict[int, Ends] = {}  # a job's releases while they hold (place.py)
        self.pools: dict[PoolKey, Pool] = {}  # counted over `avail` (never handed out)
        self.version = 0  # one more each time it moves to another pass
        self.on_node: dict[int, list[tuple[int, int, bool]]] = {}  # node: (id, mask, excl.)
        free, avail, jobs_on, on_node = self.free, self.avail, self.jobs_on, self.on_node
        taken = ix.taken
        for job in running:
            picks = self.by_id[id(job)] = _picks(taken, job, on_node)
            for i, mask in picks:
                jobs_on[i] += 1
                free[i] &= ~mask
                if avail[i] >= 0:
                    avail[i] = -1 if job.exclusive else free[i].bit_count()
        self.unique = len(self.by_id) == len(running)

    def gpus_of(self, running: tuple[Running, ...]) -> list[list[tuple[int, int]]]:
        return list(map(self.by_id.__getitem__, map(id, running)))

    def redo(self, ix: ClusterIndex, running: tuple[Running, ...]) -> Marked | None:
        """This marking moved to `running`, or None when too much changed (rebuild)."""
        by_id = self.by_id
        now = set(map(id, running))
        if len(now) != len(running):
            return None
        # the order of either does not matter: a node's state is a set of its jobs
        new = now - by_id.keys()
        added = [job for job in running if id(job) in new] if new else []
        gone = by_id.keys() - now
        if len(added) + len(gone) > len(running) // 2 + 8:
            return None
        on_node, touched = self.on_node, set()
        ends = self.ends
        for k in gone:
            ends.pop(k, None)
            for i, _ in by_id.pop(k):
                touched.add(i)
                on_node[i] = [e for e in on_node[i] if e[0] != k]
        taken = ix.taken
        for job in added:
            picks = by_id[id(job)] = _picks(taken, job, on_node)
            touched.update(i for i, _ in picks)
        sk = ix._sk
        healthy, base, chain = sk.healthy, sk.avail, sk.chain
        free, avail, jobs_on, pools = self.free, self.avail, self.jobs_on, self.pools.values()
        for i in sorted(touched):
            on = on_node.get(i, ())
            f, excl = healthy[i], False
            for _, mask, x in on:
                f &= ~mask
                excl |= x
            free[i], jobs_on[i] = f, len(on)
            was = avail[i]
            avail[i] = base[i] if base[i] < 0 else -1 if excl else f.bit_count()
            if avail[i] != was:
                for pool in pools:
                    if pool.member[i]:
                        pool.move(chain[i], i, was, avail[i])
        self.running = running
        self.version += 1
        return self


def _picks(
    taken: Callable[[Grant], tuple[int, int] | None],
    job: Running,
    on_node: dict[int, list[tuple[int, int, bool]]],
) -> list[tuple[int, int]]:
    """The (node, mask) pairs a running job holds, each also listed under its node."""
    picks = []
    for grant in job.grants:
        got = taken(grant)
        if got is None:
            continue  # a node gone from the snapshot holds nothing
        picks.append(got)
        on_node.setdefault(got[0], []).append((id(job), got[1], job.exclusive))
    return picks
