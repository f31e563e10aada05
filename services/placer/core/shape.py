"""Pure core, what a request asks for in placement terms, and the checks needing no room.

A request is reduced to a Shape: nmin..nmax nodes of g GPUs each, or a GPU total laid
out freely (then nmin..nmax is the estimate used for bookings: whole nodes of the widest
size). Prechecks give the reasons that no amount of free room would change.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from services.placer.core.counted import Counts, meets, nodes_needed
from services.placer.core.fabric import fabric_wait
from services.placer.core.index import ClusterIndex
from services.placer.core.job_pool import Choice, job_choices, job_pool
from services.placer.core.model import JobRequest, Waiting
from services.placer.core.sizes import size_words, too_small


class Shape(NamedTuple):
    nmin: int
    nmax: int
    g: int  # GPUs per node
    total: int | None  # a free-form GPU total, laid out by select_total
    gpus: int  # GPUs the job counts against limits


def shape_of(job: JobRequest, ix: ClusterIndex, counts: Counts = ()) -> Shape:
    """`counts`: the feature counts of the choice placed in; a GPU total spreads over at
    least as many nodes as they need (its bookings estimate that many whole nodes)."""
    total = job.gpus_total
    if total is not None and job.gpus_per_node == 0 and total > 0:
        width = max(ix.width, 1)
        need = nodes_needed(counts)
        if total <= width and need <= 1:  # one node: a plain single-node shape places best
            return Shape(1, 1, total, None, total)
        n = max(math.ceil(total / width), need)
        return Shape(n, max(n, total_cap(job, ix)), width, total, total)
    return Shape(
        job.nodes_min,
        job.nodes_max,
        job.gpus_per_node,
        None,
        job.nodes_min * job.gpus_per_node,
    )


def total_cap(job: JobRequest, ix: ClusterIndex) -> int:
    """The most nodes a GPU total may spread over: `nodes_max` when it names more than
    one (raised to as many widest nodes as the total fills), else any number; one GPU a
    node at least."""
    total = job.gpus_total or 0
    cap = job.nodes_max if job.nodes_max > 1 else len(ix.nodes)
    return min(max(cap, math.ceil(total / max(ix.width, 1))), total)


def is_total(job: JobRequest) -> bool:
    return job.gpus_total is not None and job.gpus_per_node == 0 and job.gpus_total > 0


def precheck(ix: ClusterIndex, job: JobRequest) -> tuple[Waiting, str] | None:
    """HELD, a blocker's reason, BAD_CONSTRAINTS, PARTITION_DOWN, NODES_EXCLUDED, or None."""
    if job.held:
        return Waiting.HELD, "held"
    if job.blocked_by is not None:
        return job.blocked_by.reason, job.blocked_by.detail
    if job.nodes_min < 1 or job.nodes_min > job.nodes_max or job.gpus_per_node < 0:
        return Waiting.BAD_CONSTRAINTS, "nodes must be 1 <= min <= max, GPUs >= 0"
    if job.time_limit_s < 1 or (job.gpus_total is not None and job.gpus_total < 0):
        return Waiting.BAD_CONSTRAINTS, "time limit must be >= 1 s and a GPU total >= 0"
    pool = job_pool(ix, job)
    if (fabric := fabric_wait(ix, job, pool)) is not None:
        return fabric
    if pool.size == 0:
        model = f" with {job.gpu_model} GPUs" if job.gpu_model else ""
        model += f" matching {job.constraint}" if job.constraint else ""
        return Waiting.BAD_CONSTRAINTS, f"no node serves partition {job.partition}{model}"
    if pool.up == 0:
        return Waiting.PARTITION_DOWN, f"no node of partition {job.partition} is up"
    if job.gpus_per_node > pool.widest:
        return Waiting.BAD_CONSTRAINTS, f"nodes have at most {pool.widest} healthy GPUs"
    if job.gpus_total is not None and job.gpus_total > pool.gpus:
        most = max(c.pool.gpus for c in job_choices(ix, job))  # a matching OR's widest
        if job.gpus_total > most:
            return Waiting.BAD_CONSTRAINTS, f"partition {job.partition} has {most} GPUs"
    if job.constraint:
        why = _together(ix, job)
        if why is not None:
            return Waiting.BAD_CONSTRAINTS, why
    if job.nodes_min > pool.size and not is_total(job):
        return Waiting.BAD_CONSTRAINTS, f"partition {job.partition} has {pool.size} nodes"
    if small := too_small(ix, job):
        big = sum(1 for i, m in enumerate(pool.member) if m and i not in small)
        if big < (1 if is_total(job) else job.nodes_min):
            return Waiting.BAD_CONSTRAINTS, (
                f"{big} node(s) of partition {job.partition} have {size_words(job)} per node"
            )
    if job.required_nodes or job.excluded_nodes:
        return _node_lists(ix, job, pool.size)
    return None


def _node_lists(ix: ClusterIndex, job: JobRequest, size: int) -> tuple[Waiting, str] | None:
    unknown = [n for n in job.required_nodes if n not in ix.id_of]
    if unknown:
        return Waiting.BAD_CONSTRAINTS, f"unknown nodes {', '.join(unknown)}"
    down = [n for n in job.required_nodes if not ix.up[ix.id_of[n]]]
    if down:
        return Waiting.NODES_EXCLUDED, f"required nodes not up: {', '.join(down)}"
    pool = job_pool(ix, job)
    left = size - sum(1 for n in set(job.excluded_nodes) if pool.member[ix.id_of.get(n, 0)])
    if (job.required_nodes and len(job.required_nodes) < job.nodes_min) or left < job.nodes_min:
        return Waiting.NODES_EXCLUDED, "too few nodes left once the excluded ones are out"
    return None


def _together(ix: ClusterIndex, job: JobRequest) -> str | None:
    """Why no set of the partition's nodes, up or not, meets the job's constraint
    together (feature counts, or one [..] alternative for all), or None."""
    choices = job_choices(ix, job)
    if len(choices) == 1 and not choices[0].counts:
        return None
    need = min(nodes_needed(c.counts) for c in choices)
    if is_total(job) and need > (most := total_cap(job, ix)):
        asked = f"--gpus={job.gpus_total} spreads over {most} at most"
        return f"--constraint {job.constraint} needs {need} nodes; {asked}"
    if not is_total(job) and need > job.nodes_max:
        return f"--constraint {job.constraint} needs {need} nodes; the job asks for {job.nodes_max}"
    least = 1 if is_total(job) else job.nodes_min  # a GPU total's node count is its own
    if any(_can_meet(ix, c, least) for c in choices):
        return None
    return (
        f"no {least} node(s) of partition {job.partition} satisfy --constraint "
        f"{job.constraint} together"
    )


def _can_meet(ix: ClusterIndex, choice: Choice, nodes: int) -> bool:
    pool, counts = choice
    known = pool.together.get((counts, nodes))
    if known is None:
        members = [i for i in range(len(ix.nodes)) if pool.member[i]]
        enough = len(members) >= max(nodes, nodes_needed(counts))
        known = pool.together[(counts, nodes)] = enough and meets(ix, members, counts)
    return known


def counted_shape(shape: Shape, job: JobRequest, ix: ClusterIndex, choice: Choice) -> Shape:
    """A GPU total's shape in one choice: spread over as many nodes as its counts need."""
    if not choice.counts or job.gpus_total is None or job.gpus_per_node != 0:
        return shape
    return shape_of(job, ix, choice.counts)


def within_limits(shape: Shape, room: int | None) -> Shape:
    """An elastic gang grows only as far as the tightest GPU cap allows."""
    if room is None or shape.g <= 0 or shape.total is not None:
        return shape
    return shape._replace(nmax=max(shape.nmin, min(shape.nmax, room // shape.g)))
