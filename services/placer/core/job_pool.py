"""Pure core: which pool of the index a job places in — its partition, its GPU type
and its `--constraint`. A matching OR (`[rack1|rack2]`) puts all of a job's nodes in
one alternative, and so does an OR with feature counts (`a*2|b*2`): each alternative is
a choice of its own (its pool, its counts), tried in turn. A counted feature (`a*2`) is
not needed on every node, so the pool admits nodes without it; counted.py meets it."""

from __future__ import annotations

from typing import NamedTuple

from services.placer.core.counted import Counts, counted
from services.placer.core.fabric import pool_for
from services.placer.core.index import ClusterIndex
from services.placer.core.model import JobRequest
from services.placer.core.pools import Pool
from services.placer.core.skeleton import parse_constraint


class Choice(NamedTuple):
    pool: Pool
    counts: Counts  # the counted terms its nodes must meet together


def job_choices(ix: ClusterIndex, job: JobRequest) -> list[Choice]:
    """The pools a job may place in, one per alternative that must hold it whole."""
    if not job.constraint:
        return [Choice(pool_for(ix, job), ())]
    parsed = parse_constraint(job.constraint)
    together = parsed.matching or any(t.count is not None for a in parsed.alternatives for t in a)
    if not together:
        return [Choice(pool_for(ix, job, job.constraint), ())]
    out = []
    for alt in parsed.alternatives:
        # the counts are in the key so each choice is a pool of its own (counts_in)
        key = "&".join(t.feature + (f"*{t.count}" if t.count else "") for t in alt) or None
        out.append(Choice(pool_for(ix, job, key), counted(alt)))
    return out


def job_pool(ix: ClusterIndex, job: JobRequest) -> Pool:
    """The pool a job is judged by when it waits: the first choice with room for it
    now, else the first big enough."""
    if not job.constraint:
        return pool_for(ix, job)  # the common case, asked several times per job a pass
    pools = [c.pool for c in job_choices(ix, job)]
    if len(pools) == 1:
        return pools[0]
    total = job.gpus_total
    if total is not None and job.gpus_per_node == 0:  # a GPU total: judged by GPUs
        for pool in pools:
            if sum(k * len(b) for k, b in enumerate(pool.buckets)) >= total:
                return pool
        return next((p for p in pools if p.gpus >= total), pools[0])
    for pool in pools:
        fits = sum(len(b) for b in pool.buckets[job.gpus_per_node :])
        if fits >= job.nodes_min:
            return pool
    return next((p for p in pools if p.size >= job.nodes_min), pools[0])


def counts_in(ix: ClusterIndex, job: JobRequest, pool: Pool) -> Counts:
    """The feature counts (`a*2`) a job's nodes in `pool` must meet together."""
    if not job.constraint:
        return ()
    return next((c.counts for c in job_choices(ix, job) if c.pool is pool), ())
