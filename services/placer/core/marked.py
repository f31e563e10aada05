"""Pure core, working state: the running jobs of a pass marked on a node skeleton.

Marking every running job's GPUs is most of what building an index costs, and passes
over the same nodes (the simulator's, a service's between node events) see mostly the
same running jobs. A `Marked` is kept with the skeleton (skeleton.py) for the next pass,
which redoes only the nodes of the jobs that came or went: free GPUs, jobs per node and
`avail` depend only on the set of jobs on a node, not their order, so that is exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from services.placer.core.model import Grant, Node, Running
from services.placer.core.pools import Pool, PoolKey

# a running job's releases (timeline.Release tuples), made at a time `from`, good for
# any now in [from, until) with the same use_predictions: (from, until, use, releases)
Ends = tuple[float, float, bool, list[Any]]
# a running job's grant -> (node id, GPU mask), None for a node not in the skeleton
Taken = Callable[[Grant], tuple[int, int] | None]


class Nodes(Protocol):
    """What a marking reads of the node skeleton (skeleton.Skeleton, which keeps the last
    marking: a protocol, not an import back, keeps the graph acyclic)."""

    nodes: list[Node]
    healthy: list[int]  # healthy GPUs per node, a bitmask
    avail: list[int]  # free GPUs per node with nothing running (-1: it takes none)
    chain: list[tuple[int, ...]]  # each node's domains, root first


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
        "skeleton",
        "unique",
        "version",
    )

    def __init__(self, sk: Nodes, taken: Taken, running: tuple[Running, ...]) -> None:
        # the skeleton's facts the marking reads (not the skeleton: it keeps the marking)
        self.skeleton = (sk.healthy, sk.avail, sk.chain)
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

    def redo(self, taken: Taken, running: tuple[Running, ...]) -> Marked | None:
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
        for job in added:
            picks = by_id[id(job)] = _picks(taken, job, on_node)
            touched.update(i for i, _ in picks)
        healthy, base, chain = self.skeleton
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
    taken: Taken,
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
