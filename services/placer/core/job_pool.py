"""Pure core: which pool of the index a job places in — its partition, its GPU type
and its `--constraint`. A matching OR (`[rack1|rack2]`) puts all of a job's nodes in
one alternative: the first that has room for the job now, else the first big enough.
Feature counts (`a*2`) are checked by admission; here a counted feature is not needed
on every node, so the pool admits nodes without it."""

from __future__ import annotations

from services.placer.core.index import ClusterIndex, Pool, parse_constraint
from services.placer.core.model import JobRequest


def job_pool(ix: ClusterIndex, job: JobRequest) -> Pool:
    if not job.constraint:
        return ix.pool(job.partition, job.gpu_model)
    parsed = parse_constraint(job.constraint)
    if not parsed.matching or len(parsed.alternatives) < 2:
        return ix.pool(job.partition, job.gpu_model, job.constraint)
    pools = [
        ix.pool(job.partition, job.gpu_model, "&".join(t.feature for t in alt if not t.count))
        for alt in parsed.alternatives
    ]
    for pool in pools:
        fits = sum(len(b) for b in pool.buckets[job.gpus_per_node :])
        if fits >= job.nodes_min:
            return pool
    return next((p for p in pools if p.size >= job.nodes_min), pools[0])
