"""Pure core: spare nodes for a fixed-size job that lost some to a fault.

The spares are a small gang of their own (`count` nodes with the job's GPUs per node),
sought first inside the topology domain of the nodes the job keeps — the same leaf
switch, then each level up — and only then anywhere, so the restarted job stays as
close together as it was. Replacing lost capacity is not growth: limits do not apply,
nor backfill or preemption (a spare is taken only if it is free now). Spares (and the
nodes an elastic job grows onto, asked the same way) join a gang of several nodes, so
a node a fabric fault keeps out of multi-node jobs is never one (core/fabric.py). With
the nodes kept they meet the job's `--constraint` as a whole: the alternative the kept
nodes are in, and the feature counts they do not meet yet (shared.constraint.residual).
"""

from __future__ import annotations

import msgspec

from services.placer.core.model import JobRequest, Limits, PolicyConfig, Snapshot, Start
from services.placer.core.place import place
from services.placer.core.skeleton import parse_constraint
from shared.constraint import residual

SPARE_POLICY = PolicyConfig(backfill=False, preemption=False)


def place_spares(
    snapshot: Snapshot, job: JobRequest, near: tuple[str, ...], now: float
) -> Start | None:
    """The spares for `job` closest to the `near` nodes, or None when none are free."""
    if near:  # the spares join the nodes kept: a gang of several, whatever `job` asks
        job = msgspec.structs.replace(job, multi_node=True)
    by_name = {n.name: n for n in snapshot.nodes}
    if job.constraint and near:
        kept = [by_name[n].features for n in near if n in by_name]
        rest = residual(parse_constraint(job.constraint), kept)
        if rest is None:
            return None  # the kept nodes fit none of its alternatives together
        job = msgspec.structs.replace(job, constraint=rest or None)
    paths = {by_name[n].topology for n in near if n in by_name}
    depth = max((len(p) for p in paths), default=0)
    for level in range(depth, -1, -1):
        prefixes = {p[:level] for p in paths} or {()}
        nodes = tuple(n for n in snapshot.nodes if n.topology[:level] in prefixes)
        scoped = msgspec.structs.replace(snapshot, nodes=nodes, limits=Limits())
        plan = place(scoped, [job], now, SPARE_POLICY)
        if plan.starts:
            return plan.starts[0]
    return None
