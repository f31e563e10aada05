"""Pure core: the nodes too small for a job's CPUs and memory per node.

Nodes announce their CPUs and memory (shared.node_size); a job asks `cpus_per_node`
and `mem_per_node_mib` of each of its nodes. A node smaller than that is left out of
the job's choice, as an excluded node is (place.py `_ok`), and a job no node of its
partition is big enough for waits BAD_CONSTRAINTS (shape.py `precheck`). What running
jobs hold of a node's memory is memory.py's; here a node's size alone.
"""

from __future__ import annotations

from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest
from shared.node_size import big_enough

NONE: frozenset[int] = frozenset()


def too_small(ix: ClusterIndex, job: JobRequest) -> frozenset[int]:
    """Ids of the nodes without the job's CPUs or memory per node (cached per size on
    the index: most jobs of a queue ask alike, and most ask what every node has)."""
    if job.mem_per_node_mib == 0 and job.cpus_per_node <= 1:
        return NONE  # what most jobs ask, and every node has: no lookup on the hot path
    key = (job.cpus_per_node, job.mem_per_node_mib)
    found = ix.too_small.get(key)
    if found is None:
        found = ix.too_small[key] = frozenset(
            i for i, n in enumerate(ix.nodes) if not big_enough(n.cpus, n.memory_mib, *key)
        )
    return found


def size_words(job: JobRequest) -> str:
    """`8 CPUs and 65536 MiB`: what the job asks of each node, as a wait says it."""
    memory = f" and {job.mem_per_node_mib} MiB" if job.mem_per_node_mib else ""
    return f"{job.cpus_per_node} CPUs{memory}"
