"""Test builders for the placer core: node(), gang(), running(), snapshot()."""

from __future__ import annotations

from typing import Any

from services.placer.core import (
    Gpu,
    Grant,
    JobRequest,
    Node,
    NodeState,
    Running,
    Snapshot,
)

T0 = 1_700_000_000.0  # "now" in every table


def node(
    name: str,
    gpus: int = 8,
    *,
    state: NodeState = NodeState.UP,
    topology: tuple[str, ...] = (),
    block: str | None = None,
    partitions: tuple[str, ...] = (),
    groups: int = 1,
    unhealthy: tuple[int, ...] = (),
    model: str = "sim",
) -> Node:
    """A node of `gpus` GPUs split evenly into `groups` locality groups."""
    per_group = max(1, gpus // max(groups, 1))
    return Node(
        name=name,
        gpus=tuple(
            Gpu(index=i, model=model, locality=i // per_group, healthy=i not in unhealthy)
            for i in range(gpus)
        ),
        state=state,
        topology=topology,
        block=block,
        partitions=partitions,
    )


def gang(
    job_id: int, nodes: int | tuple[int, int] = 1, gpus_per_node: int = 0, **kw: Any
) -> JobRequest:
    """A pending job; `nodes` is a count or (min, max). Submitted at T0 - 1000 + id."""
    nmin, nmax = nodes if isinstance(nodes, tuple) else (nodes, nodes)
    kw.setdefault("user", "alice")
    kw.setdefault("submitted_at", T0 - 1000 + job_id)
    return JobRequest(
        job_id=job_id, nodes_min=nmin, nodes_max=nmax, gpus_per_node=gpus_per_node, **kw
    )


def grant(node_name: str, *gpus: int) -> Grant:
    return Grant(node=node_name, gpus=tuple(gpus))


def running(job_id: int, *grants: Grant, **kw: Any) -> Running:
    """A running job, started an hour before T0 with a two-hour limit unless told."""
    kw.setdefault("user", "bob")
    kw.setdefault("account", "default")
    kw.setdefault("started_at", T0 - 3600)
    kw.setdefault("time_limit_s", 7200)
    return Running(job_id=job_id, grants=grants, **kw)


def whole(node_name: str, gpus: int = 8) -> Grant:
    return Grant(node=node_name, gpus=tuple(range(gpus)))


def snapshot(*nodes: Node, running: tuple[Running, ...] = (), **kw: Any) -> Snapshot:
    return Snapshot(nodes=nodes, running=running, **kw)


def leafy(n: int, per_leaf: int, gpus: int = 8, leaves_per_spine: int = 0) -> tuple[Node, ...]:
    """n nodes named n00.., per_leaf to a leaf switch, optionally spines above leaves."""
    out = []
    for i in range(n):
        leaf = i // per_leaf
        path: tuple[str, ...] = (f"leaf{leaf}",)
        if leaves_per_spine:
            path = (f"spine{leaf // leaves_per_spine}", *path)
        out.append(node(f"n{i:02d}", gpus, topology=path))
    return tuple(out)
