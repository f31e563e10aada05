"""Pure core: GPUs a partition keeps for its own jobs (`reserved_gpus`, e.g. a few GPUs
always free for `debug`), as a wrapper around `place`.

The partitions that keep GPUs place first, on the whole cluster. Then the kept GPUs
still free on their nodes are held by placeholder jobs that never end and cannot be
preempted, and every other job is placed around them. A kept GPU busy with another job
now is not taken from it; it is kept again once that job ends.

A job of another partition that fits only on kept GPUs (its estimated start is when the
placeholders end: never) waits BAD_CONSTRAINTS saying so, without an estimated start.
Before, it waited RESOURCES with a start 31 years ahead (`FOREVER_S`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from services.placer.core.model import (
    Grant,
    JobRequest,
    Plan,
    PolicyConfig,
    Running,
    Snapshot,
    Start,
    Wait,
    Waiting,
)
from services.placer.core.place import DEFAULT_POLICY, place

FOREVER_S = 10**9


def place_keeping(
    snapshot: Snapshot,
    pending: Sequence[JobRequest],
    now: float,
    kept: Mapping[str, int],
    config: PolicyConfig = DEFAULT_POLICY,
) -> Plan:
    """`place`, with `kept[partition]` GPUs on that partition's nodes for its jobs only."""
    if not any(kept.values()):
        return place(snapshot, pending, now, config)
    own = [j for j in pending if j.partition in kept]
    rest = [j for j in pending if j.partition not in kept]
    first = place(snapshot, own, now, config)
    started = {j.job_id: j for j in own}
    running = (*snapshot.running, *(_as_running(started[s.job_id], s, now) for s in first.starts))
    after = msgspec.structs.replace(snapshot, running=running)
    holds = _holds(after, kept, now)
    second = place(msgspec.structs.replace(after, running=(*running, *holds)), rest, now, config)
    return Plan(
        starts=first.starts + second.starts,
        preemptions=first.preemptions + second.preemptions,
        waits=first.waits + tuple(_never(w, holds, now) for w in second.waits),
    )


def _never(wait: Wait, holds: Sequence[Running], now: float) -> Wait:
    """A wait whose start is the placeholders' end, said as what it is: the job fits
    only on GPUs other partitions keep, so it cannot start as the cluster is set up."""
    if wait.estimated_start is None or wait.estimated_start < now + FOREVER_S / 2:
        return wait
    keepers = ", ".join(sorted({h.partition for h in holds}))
    return Wait(
        job_id=wait.job_id,
        reason=Waiting.BAD_CONSTRAINTS,
        detail=f"it fits only on GPUs partition(s) {keepers} keep for their own jobs"
        " (reserved_gpus): ask for fewer GPUs or nodes, or another partition",
    )


def _as_running(job: JobRequest, start: Start, now: float) -> Running:
    return Running(
        job_id=job.job_id,
        user=job.user,
        account=job.account,
        partition=job.partition,
        qos=job.qos,
        tier=job.tier,
        priority=job.priority,
        preemptible=job.preemptible,
        started_at=now,
        time_limit_s=job.time_limit_s,
        grants=start.grants,
        exclusive=job.exclusive,
        predicted_s=job.predicted_s,
    )


def _holds(snapshot: Snapshot, kept: Mapping[str, int], now: float) -> tuple[Running, ...]:
    """Placeholders on the free GPUs each partition keeps (its nodes, last GPUs first)."""
    busy = {(g.node, i) for r in snapshot.running for g in r.grants for i in g.gpus}
    taken: set[tuple[str, int]] = set()
    holds: list[Running] = []
    for partition, count in sorted(kept.items()):
        grants: list[Grant] = []
        left = count
        for node in reversed(snapshot.nodes):
            if left <= 0:
                break
            if node.partitions and partition not in node.partitions:
                continue
            free = [
                g.index
                for g in reversed(node.gpus)
                if g.healthy and (node.name, g.index) not in busy | taken
            ][:left]
            if free:
                grants.append(Grant(node=node.name, gpus=tuple(sorted(free))))
                taken.update((node.name, i) for i in free)
                left -= len(free)
        if grants:
            holds.append(
                Running(
                    job_id=-(len(holds) + 1),
                    user=f"(kept for {partition})",
                    account="",
                    partition=partition,
                    tier=1 << 30,
                    preemptible=False,
                    started_at=now,
                    time_limit_s=FOREVER_S,
                    grants=tuple(grants),
                )
            )
    return tuple(holds)
