"""Pure core, working state: a mutable index of free GPUs built from one Snapshot.

The index exists for the length of one pass (or one prepared cluster, see `prepare`). It
keeps what placement asks for constantly in O(1):

- per node: a bitmask of free healthy GPUs and `avail` (their count, -1 if the node takes
  no new work: not UP, or held whole by an exclusive job);
- per pool (pools.py: nodes serving one partition with one GPU type or model, and
  fitting one `--constraint`) and per topology domain: how many pool nodes have >= k
  GPUs free, and the nodes bucketed by free count, moved on every take and release.

It stands on the node skeleton (skeleton.py: numbering, GPU bits, domains) and on the
last pass's marking of the running jobs (marked.py), both kept between passes.
"""

from __future__ import annotations

from services.placer.core.marked import Marked
from services.placer.core.model import Grant, Snapshot
from services.placer.core.pools import Pool, PoolKey
from services.placer.core.skeleton import skeleton

# (node width, Gpu.index values) -> bitmask, on nodes whose bits are the indexes
_PLAIN_MASKS: dict[tuple[int, tuple[int, ...]], int] = {}
_GPUS_OF: dict[tuple[tuple[int, ...], int], tuple[int, ...]] = {}  # the reverse


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
        # (CPUs, MiB) a job asks per node -> the node ids too small for it (sizes.py)
        self.too_small: dict[tuple[int, int], frozenset[int]] = {}
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
        got = None if last is None else last.redo(self.taken, running)
        if got is None:
            got = Marked(sk, self.taken, running)
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
