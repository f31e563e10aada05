"""Pure core: fabric faults and multi-node work.

A node whose fabric links carry collectives badly (a fault the health catalog gives the
action `exclude_multi_node`: errors rising, a link trained down to a lower speed) stays
UP: a single-node job never touches the fabric and may use it. Every job that spans
nodes (a gang, an elastic job that may grow past one node, a GPU total wider than one
node, and the spares or growth of such a job: `JobRequest.multi_node`) places in pools
that leave it out, until the link is stable again and health clears the flag.
"""

from __future__ import annotations

from services.placer.core.index import ClusterIndex, Pool
from services.placer.core.model import JobRequest, Waiting


def spans_nodes(ix: ClusterIndex, job: JobRequest) -> bool:
    """Whether the job may run on more than one node (so it needs a sound fabric)."""
    if job.multi_node or job.nodes_max > 1:
        return True
    total = job.gpus_total
    return total is not None and job.gpus_per_node == 0 and total > max(ix.width, 1)


def pool_for(ix: ClusterIndex, job: JobRequest, constraint: str | None = None) -> Pool:
    """The job's pool for one constraint: without the fabric-excluded nodes when the
    job spans nodes."""
    return ix.pool(job.partition, job.gpu_model, constraint, multi_node=spans_nodes(ix, job))


def fabric_wait(ix: ClusterIndex, job: JobRequest, pool: Pool) -> tuple[Waiting, str] | None:
    """NODES_EXCLUDED when fabric faults alone leave a multi-node job too few nodes (or
    a node it requires), so it waits for the links instead of reading as impossible."""
    if not spans_nodes(ix, job):
        return None
    excluded = [n.name for n in ix.nodes if n.multi_node_excluded]
    if not excluded:
        return None
    required = [n for n in job.required_nodes if n in excluded]
    if required:
        return Waiting.NODES_EXCLUDED, _why(required, ix)
    if pool.up >= job.nodes_min:
        return None  # enough sound nodes up: any wait is for room, not for the fabric
    whole = ix.pool(job.partition, job.gpu_model, pool.key[2])
    if whole.up >= job.nodes_min:
        return Waiting.NODES_EXCLUDED, _why([n for n in excluded if _in(whole, ix, n)], ix)
    return None


def _in(pool: Pool, ix: ClusterIndex, name: str) -> bool:
    return bool(pool.member[ix.id_of[name]])


def _why(names: list[str], ix: ClusterIndex) -> str:
    by_name = {n.name: n for n in ix.nodes}
    shown = "; ".join(f"{n} ({by_name[n].multi_node_excluded})" for n in names[:4])
    more = f" and {len(names) - 4} more" if len(names) > 4 else ""
    return f"kept out of multi-node jobs by fabric faults: {shown}{more}"
