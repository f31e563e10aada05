"""Health SQL: the monitor owns `nodes` and `gpus`. Each function runs inside the
caller's transaction.

The monitor's state machine (`monitor_core.NodeHealth`) lives in these two tables, so
`load_health` rebuilds it and `save_health` writes it back; times are epoch seconds in
the core and `timestamptz` here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

import asyncpg

from services.health.monitor_model import GpuHealth, NodeHealth, Recovery
from shared.db import Conn
from shared.events import NodeRegistered
from shared.retention import trim_oldest
from shared.states import NodeState


def _epoch(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _stamp(at: float | None) -> datetime | None:
    return None if at is None else datetime.fromtimestamp(at, UTC)


async def db_now(conn: Conn) -> float:
    """The monitor's one clock: the transaction's `now()`, in epoch seconds."""
    now: float = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
    return now


def _state(raw: str) -> NodeState:
    try:
        return NodeState(raw)
    except ValueError:
        return NodeState.DOWN


# How many live allocations hold each of the named nodes (indexed: migration 0021).
LIVE_PER_NODE = (
    "SELECT node, count(*)::int AS n FROM allocation_nodes"
    " WHERE live AND node = ANY($1::text[]) GROUP BY node"
)


ALLOCATED_GPUS = "SELECT node, array_agg(gpu) AS gpus FROM allocation_gpus WHERE live GROUP BY node"

# The GPU time a liveness pass counted, added to its hour's rows (utilization.py).
ADD_GPU_TIME = """
INSERT INTO cluster_hours(hour, state, gpu_seconds)
SELECT to_timestamp($1), s, t FROM unnest($2::text[], $3::float8[]) AS x(s, t)
ON CONFLICT (hour, state)
DO UPDATE SET gpu_seconds = cluster_hours.gpu_seconds + excluded.gpu_seconds
"""

# The hourly GPU time older than kept (`MUSTER_USAGE_KEEP_S`), from the head of its key
# (hour first).
PRUNE_CLUSTER_HOURS = trim_oldest("cluster_hours", "hour")


async def allocated_gpus(conn: Conn) -> dict[str, frozenset[int]]:
    """Each node's GPUs a live allocation holds (by the index of live holders)."""
    return {r["node"]: frozenset(r["gpus"]) for r in await conn.fetch(ALLOCATED_GPUS)}


async def add_gpu_time(conn: Conn, hour: float, seconds: Mapping[str, float]) -> None:
    """Add GPU-seconds per state to the hour starting at `hour` (epoch seconds)."""
    if not seconds:
        return
    states = sorted(seconds)
    await conn.execute(ADD_GPU_TIME, hour, states, [seconds[s] for s in states])


async def load_health(conn: Conn, names: Sequence[str] | None = None) -> dict[str, NodeHealth]:
    """The named nodes (all when None), locked for this transaction, with their GPUs and
    how many jobs run on each (from the placer's live allocations)."""
    rows = await conn.fetch(
        "SELECT * FROM nodes WHERE $1::text[] IS NULL OR name = ANY($1::text[])"
        " ORDER BY name FOR UPDATE",
        None if names is None else list(names),
    )
    if not rows:
        return {}
    found = [r["name"] for r in rows]
    gpus = await conn.fetch(
        "SELECT node, idx, healthy, reset_pending, last_xid FROM gpus"
        " WHERE node = ANY($1::text[]) ORDER BY node, idx",
        found,
    )
    busy = await conn.fetch(LIVE_PER_NODE, found)
    running: dict[str, int] = {r["node"]: r["n"] for r in busy}
    by_node: dict[str, list[GpuHealth]] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(
            GpuHealth(
                index=g["idx"],
                healthy=g["healthy"],
                reset_pending=g["reset_pending"],
                last_xid=g["last_xid"],
            )
        )
    return {r["name"]: _node(r, tuple(by_node.get(r["name"], ())), running) for r in rows}


def _node(r: asyncpg.Record, gpus: tuple[GpuHealth, ...], running: dict[str, int]) -> NodeHealth:
    return NodeHealth(
        name=r["name"],
        state=_state(r["state"]),
        reason=r["reason"],
        since=r["state_since"].timestamp(),
        last_heartbeat=_epoch(r["last_heartbeat"]),
        boot_id=r["boot_id"],
        fault_boot_id=r["fault_boot_id"],
        recovery=Recovery(r["recovery"]),
        operator_drain=r["operator_drain"],
        held=r["held"],
        failures=tuple(r["failures"]),
        clean_boot_id=r["clean_boot_id"],
        running=running.get(r["name"], 0),
        gpus=gpus,
        multi_node_excluded=json.loads(r["multi_node_excluded"]),
    )


async def save_health(conn: Conn, nodes: Iterable[NodeHealth]) -> None:
    """Write back what the core decided. A heartbeat time only moves forward."""
    nodes = list(nodes)
    await conn.executemany(
        "UPDATE nodes SET state = $2, reason = $3, state_since = $4, boot_id = $5,"
        " last_heartbeat = GREATEST(last_heartbeat, $6), recovery = $7, fault_boot_id = $8,"
        " operator_drain = $9, held = $10, failures = $11, clean_boot_id = $12,"
        " multi_node_excluded = $13::jsonb, updated_at = now()"
        " WHERE name = $1",
        [
            (
                n.name,
                str(n.state),
                n.reason,
                _stamp(n.since),
                n.boot_id,
                _stamp(n.last_heartbeat),
                str(n.recovery),
                n.fault_boot_id,
                n.operator_drain,
                n.held,
                list(n.failures),
                n.clean_boot_id,
                json.dumps(n.multi_node_excluded, sort_keys=True),
            )
            for n in nodes
        ],
    )
    await conn.executemany(
        "UPDATE gpus SET healthy = $3, reset_pending = $4, last_xid = $5"
        " WHERE node = $1 AND idx = $2",
        [(n.name, g.index, g.healthy, g.reset_pending, g.last_xid) for n in nodes for g in n.gpus],
    )


async def upsert_inventory(conn: Conn, reg: NodeRegistered, *, prune: bool) -> None:
    """Record a node and its GPUs as it announces them. New rows start UP and healthy;
    health of known rows is the state machine's. `prune` drops GPUs no longer present
    (only after a passing check, so a GPU that fell off stays visible as unhealthy)."""
    await conn.execute(
        "INSERT INTO nodes(name, address, topology, features, cpus, memory_mib)"
        " VALUES ($1, $2, $3, $4, $5, $6)"
        " ON CONFLICT (name) DO UPDATE SET address = $2, topology = $3, features = $4,"
        " cpus = $5, memory_mib = $6, updated_at = now()",
        reg.node,
        reg.address,
        list(reg.topology),
        list(reg.features),
        reg.cpus,
        reg.memory_mib,
    )
    if prune:
        await conn.execute(
            "DELETE FROM gpus WHERE node = $1 AND NOT (idx = ANY($2::int[]))",
            reg.node,
            [g.index for g in reg.gpus],
        )
    await conn.executemany(
        "INSERT INTO gpus(node, idx, uuid, pci, model, memory_mib, locality)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (node, idx) DO UPDATE SET"
        " uuid = $3, pci = $4, model = $5, memory_mib = $6, locality = $7",
        [(reg.node, g.index, g.uuid, g.pci, g.model, g.memory_mib, g.locality) for g in reg.gpus],
    )


async def record_check(conn: Conn, node: str, check: Mapping[str, object]) -> None:
    await conn.execute(
        "UPDATE nodes SET last_check = $2::jsonb WHERE name = $1", node, json.dumps(check)
    )


async def record_fault(conn: Conn, node: str, fault: Mapping[str, object]) -> None:
    await conn.execute(
        "UPDATE nodes SET last_fault = $2::jsonb, fault_count = fault_count + 1,"
        " updated_at = now() WHERE name = $1",
        node,
        json.dumps(fault),
    )


async def job_on_gpu(conn: Conn, node: str, gpu: int) -> int | None:
    job_id: int | None = await conn.fetchval(
        "SELECT a.job_id FROM allocation_gpus g JOIN allocations a USING (alloc_id)"
        " WHERE g.node = $1 AND g.gpu = $2 AND g.live",
        node,
        gpu,
    )
    return job_id
