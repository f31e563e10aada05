"""Pure core, working state: a pool's free-GPU counts per topology domain.

A pool is the nodes serving one partition with one GPU type or model, fitting one
`--constraint` (and, for multi-node jobs, leaving out the nodes a fabric fault keeps
out). Per topology domain (root, every switch, every block) it keeps `ge[domain][k]`,
how many pool nodes have >= k GPUs free, updated on every take and release along the
node's short domain chain; and its nodes bucketed by free count, each bucket a sorted
list, for best fit. The index (index.py) owns the pools of a pass and moves them.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from shared.constraint import Term

ROOT = 0  # the domain of the whole cluster
# (partition, the GPU type or model asked for, a --constraint without [..]; None: any,
# multi-node: the nodes a fabric fault keeps out of multi-node jobs left out).
PoolKey = tuple[str, str | None, str | None, bool]


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
