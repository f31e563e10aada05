"""Pure core: fabric faults and multi-node work.

A node whose fabric links carry collectives badly (a fault the health catalog gives the
action `exclude_multi_node`: errors rising, a link trained down to a lower speed) stays
UP: a single-node job never touches the fabric and may use it. Every job that spans
nodes (a gang, an elastic job that may grow past one node, a GPU total wider than one
node, and the spares or growth of such a job: `JobRequest.multi_node`) places in pools
that leave it out, until the link is stable again and health clears the flag.
"""

from __future__ import annotations

from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest, Waiting
from services.placer.core.pools import Pool


def spans_nodes(ix: ClusterIndex, job: JobRequest) -> bool:
    """Whether the job may run on more than one node (so it needs a sound fabric)."""
    if job.multi_node or job.nodes_max > 1:
        return True
    total = job.gpus_total
    if total is None or job.gpus_per_node != 0:
        return False
    # a total one node could hold still spreads when feature counts ask for more nodes
    return total > max(ix.width, 1) or (total > 1 and "*" in (job.constraint or ""))


def pool_for(ix: ClusterIndex, job: JobRequest, constraint: str | None = None) -> Pool:
    """The job's pool for one constraint: without the fabric-excluded nodes when the
    job spans nodes (while none is excluded, the one pool serves both kinds of job)."""
    multi = bool(ix.multi_node_excluded) and spans_nodes(ix, job)
    return ix.pool(job.partition, job.gpu_model, constraint, multi_node=multi)


def fabric_wait(ix: ClusterIndex, job: JobRequest, pool: Pool) -> tuple[Waiting, str] | None:
    """NODES_EXCLUDED when fabric faults alone leave a multi-node job too few nodes (or
    a node it requires), so it waits for the links instead of reading as impossible.
    O(1) unless it must say why: it runs for every job of every pass."""
    if not ix.multi_node_excluded or not spans_nodes(ix, job):
        return None
    required = [n for n in job.required_nodes if _excluded(ix, n)]
    if required:
        return Waiting.NODES_EXCLUDED, _why(required, ix)
    if pool.up >= job.nodes_min:
        return None  # enough sound nodes up: any wait is for room, not for the fabric
    whole = ix.pool(job.partition, job.gpu_model, pool.key[2])
    if whole.up >= job.nodes_min:
        names = [ix.nodes[i].name for i in ix.multi_node_excluded if whole.member[i]]
        return Waiting.NODES_EXCLUDED, _why(names, ix)
    return None


def _excluded(ix: ClusterIndex, name: str) -> bool:
    i = ix.id_of.get(name)
    return i is not None and bool(ix.nodes[i].multi_node_excluded)


def _why(names: list[str], ix: ClusterIndex) -> str:
    shown = "; ".join(f"{n} ({ix.nodes[ix.id_of[n]].multi_node_excluded})" for n in names[:4])
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return f"kept out of multi-node jobs by fabric faults: {shown}{more}"
