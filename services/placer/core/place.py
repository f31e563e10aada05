"""Pure core: place(snapshot, pending, now) -> Plan (first version: first-fit gangs).

No I/O, no clock, no randomness: the same input always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.model import (
    Grant,
    JobRequest,
    NodeState,
    Plan,
    PolicyConfig,
    Snapshot,
    Start,
    Wait,
    Waiting,
)

DEFAULT_POLICY = PolicyConfig()


def _free_gpus(snapshot: Snapshot) -> dict[str, list[int]]:
    busy: set[tuple[str, int]] = set()
    for job in snapshot.running:
        for grant in job.grants:
            busy.update((grant.node, g) for g in grant.gpus)
    return {
        n.name: [g.index for g in n.gpus if g.healthy and (n.name, g.index) not in busy]
        for n in snapshot.nodes
        if n.state is NodeState.UP
    }


def _order(job: JobRequest) -> tuple[float, float, float, int]:
    return (-job.tier, -job.priority, job.submitted_at, job.job_id)


def place(
    snapshot: Snapshot,
    pending: Sequence[JobRequest],
    now: float,
    config: PolicyConfig = DEFAULT_POLICY,
) -> Plan:
    free = _free_gpus(snapshot)
    starts: list[Start] = []
    waits: list[Wait] = []
    for job in sorted(pending, key=_order):
        if job.held:
            waits.append(Wait(job_id=job.job_id, reason=Waiting.HELD))
            continue
        if job.blocked_by is not None:
            waits.append(Wait(job_id=job.job_id, reason=Waiting.DEPENDENCY, detail=job.blocked_by))
            continue
        fits = [name for name, gpus in free.items() if len(gpus) >= job.gpus_per_node]
        if len(fits) < job.nodes_min:
            waits.append(Wait(job_id=job.job_id, reason=Waiting.RESOURCES))
            continue
        grants = []
        for name in fits[: job.nodes_max]:
            taken, free[name] = free[name][: job.gpus_per_node], free[name][job.gpus_per_node :]
            grants.append(Grant(node=name, gpus=tuple(taken)))
        starts.append(Start(job_id=job.job_id, grants=tuple(grants), why="first fit"))
    return Plan(starts=tuple(starts), waits=tuple(waits))
