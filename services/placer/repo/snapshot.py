"""Placer SQL, the snapshot: the cluster as the other services' tables describe it.

Nodes and GPUs (health), running allocations (ours, joined with jobs and runs), the
placement policy admission published (partitions, QOS limits, reservations, kept GPUs)
and the fairshare service's priorities. Every function takes a connection already inside
the cycle's transaction and returns core types; nothing here decides.
"""

from __future__ import annotations

import json

import asyncpg

from services.placer.core import (
    Gpu,
    Grant,
    Limits,
    Node,
    NodeState,
    QosLimit,
    Recurrence,
    Reservation,
    Running,
)
from shared.db import Conn

NO_PARTITION = ("(none)",)  # the core reads an empty tuple as "every partition"


async def load_nodes(conn: Conn) -> tuple[Node, ...]:
    """Nodes with their GPUs and features and, when a cluster config is in force, the
    partitions each serves (a node no partition names serves none) and the GPU type
    and features its node sets give it; and the fabric links (health's) that keep a
    node out of multi-node jobs."""
    policy = await conn.fetch("SELECT partition, nodes FROM partition_policy ORDER BY partition")
    rows = await conn.fetch(
        "SELECT n.name, n.state, n.topology, n.features, p.features AS given, p.gpu_type,"
        " n.multi_node_excluded::text AS fabric, n.cpus, n.memory_mib,"
        f" {_gpu_column('idx', 'idx')}, {_gpu_column('model', 'model')},"
        f" {_gpu_column('memory_mib', 'mem')}, {_gpu_column('locality', 'loc')},"
        f" {_gpu_column('healthy', 'ok')}"
        " FROM nodes n LEFT JOIN gpus g ON g.node = n.name"
        " LEFT JOIN node_policy p ON p.node = n.name"
        " GROUP BY n.name, p.node ORDER BY n.name"
    )
    return tuple(
        Node(
            name=r["name"],
            state=_node_state(r["state"]),
            topology=tuple(r["topology"]),
            partitions=_partitions_of(r["name"], policy),
            # the agent's own (topology file) and its config node sets'
            features=tuple(dict.fromkeys((*r["features"], *(r["given"] or ())))),
            gpu_type=r["gpu_type"],
            multi_node_excluded=_multi_node_excluded(r["fabric"]),
            cpus=r["cpus"],
            memory_mib=r["memory_mib"],
            gpus=tuple(
                Gpu(index=i, model=m, memory_mib=mem, locality=loc, healthy=ok)
                for i, m, mem, loc, ok in zip(
                    r["idx"], r["model"], r["mem"], r["loc"], r["ok"], strict=True
                )
            ),
        )
        for r in rows
    )


def _multi_node_excluded(raw: str) -> str:
    """Health's {link: what shows it} as the core's one text ("" : no fabric fault keeps
    the node out of multi-node jobs)."""
    links: dict[str, str] = json.loads(raw) if raw else {}
    return "; ".join(f"{link} {what}" for link, what in sorted(links.items()))


def _partitions_of(node: str, policy: list[asyncpg.Record]) -> tuple[str, ...]:
    if not policy:
        return ()
    parts = tuple(p["partition"] for p in policy if p["nodes"] is None or node in p["nodes"])
    return parts or NO_PARTITION


def _gpu_column(column: str, alias: str) -> str:
    """One GPU column of a node as an array in index order (empty for GPU-less nodes)."""
    return (
        f"coalesce(array_agg(g.{column} ORDER BY g.idx) FILTER (WHERE g.idx IS NOT NULL), '{{}}')"
        f" AS {alias}"
    )


def _node_state(raw: str) -> NodeState:
    """A state this code does not know yet places nothing: DOWN."""
    try:
        return NodeState(raw)
    except ValueError:
        return NodeState.DOWN


async def load_reservations(conn: Conn) -> tuple[Reservation, ...]:
    """Advance reservations and maintenance windows, as admission published them."""
    rows = await conn.fetch("SELECT * FROM reservations ORDER BY name")
    return tuple(
        Reservation(
            name=r["name"],
            start=r["start_at"],
            duration_s=r["duration_s"],
            nodes=tuple(r["nodes"]),
            gpus=r["gpus"],
            accounts=tuple(r["accounts"]),
            recurrence=Recurrence(r["recurrence"].upper()),
            maintenance=r["maintenance"],
        )
        for r in rows
    )


async def load_kept(conn: Conn) -> dict[str, int]:
    """GPUs each partition keeps for its own jobs (`reserved_gpus` in the config)."""
    rows = await conn.fetch(
        "SELECT partition, reserved_gpus FROM partition_policy WHERE reserved_gpus > 0"
    )
    return {r["partition"]: r["reserved_gpus"] for r in rows}


async def load_limits(conn: Conn) -> Limits:
    """Running limits per QOS, as admission published them from the cluster config."""
    rows = await conn.fetch("SELECT * FROM qos_limits")
    return Limits(
        qos={
            r["qos"]: QosLimit(
                max_gpus_per_user=r["max_gpus_per_user"],
                max_jobs_per_user=r["max_jobs_per_user"],
                max_gpus_per_account=r["max_gpus_per_account"],
                max_jobs_per_account=r["max_jobs_per_account"],
            )
            for r in rows
        }
    )


async def load_running(conn: Conn) -> tuple[Running, ...]:
    """Every live allocation as the core's Running (its live nodes only, in rank order)."""
    rows = await conn.fetch(
        "SELECT a.alloc_id, a.job_id, a.created_at, j.user_name, j.account, j.partition, j.qos,"
        " j.time_limit_s, r.started_at, j.tier, j.preemptible, j.grace_s, j.min_runtime_s,"
        " coalesce((j.spec->>'exclusive')::boolean, false) AS exclusive,"
        " coalesce(j.spec->>'name', '') AS name,"
        " coalesce((j.spec->>'mem_mib')::bigint, 0) AS mem_mib,"
        " coalesce((j.spec->>'mem_mib')::bigint = 0, false) AS mem_whole,"  # --mem=0
        " (SELECT p.for_job_id FROM preemptions p WHERE p.victim_alloc_id = a.alloc_id)"
        "   AS preempted_by,"
        " array_agg(n.node ORDER BY n.rank) AS nodes, array_agg(array_to_string(n.gpus, ',')"
        "   ORDER BY n.rank) AS gpus"
        " FROM allocations a JOIN jobs j USING (job_id)"
        " JOIN allocation_nodes n ON n.alloc_id = a.alloc_id AND n.live"
        " LEFT JOIN job_runs r ON r.job_id = a.job_id"
        " WHERE a.released_at IS NULL GROUP BY a.alloc_id, j.job_id, r.started_at"
    )
    return tuple(
        Running(
            job_id=r["job_id"],
            user=r["user_name"],
            account=r["account"],
            partition=r["partition"],
            qos=r["qos"],
            started_at=(r["started_at"] or r["created_at"]).timestamp(),
            time_limit_s=r["time_limit_s"],
            tier=r["tier"],
            preemptible=r["preemptible"],
            grace_s=r["grace_s"],
            min_runtime_s=r["min_runtime_s"],
            preempted_by=r["preempted_by"],
            exclusive=r["exclusive"],  # its nodes are held whole, not only its GPUs
            name=r["name"],
            mem_per_node_mib=r["mem_mib"],  # held on each of its nodes (core/memory.py)
            mem_whole=r["mem_whole"],
            grants=tuple(
                Grant(node=node, gpus=tuple(int(g) for g in gpus.split(",") if g))
                for node, gpus in zip(r["nodes"], r["gpus"], strict=True)
            ),
        )
        for r in rows
    )


async def load_priorities(conn: Conn) -> dict[int, float]:
    """Multifactor priority of pending jobs, as the fairshare service last computed it."""
    rows = await conn.fetch("SELECT job_id, total FROM job_priorities")
    return {r["job_id"]: float(r["total"]) for r in rows}
