"""Health SQL: the monitor owns `nodes` and `gpus`. Each function runs inside the
caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

import asyncpg

from shared.db import Conn
from shared.events import NodeRegistered


async def node_row(conn: Conn, node: str) -> asyncpg.Record | None:
    return await conn.fetchrow("SELECT * FROM nodes WHERE name = $1 FOR UPDATE", node)


async def upsert_registration(conn: Conn, reg: NodeRegistered, state: str, reason: str) -> None:
    await conn.execute(
        "INSERT INTO nodes(name, address, state, reason, topology, boot_id, last_heartbeat)"
        " VALUES ($1, $2, $3, $4, $5, $6, now()) ON CONFLICT (name) DO UPDATE SET"
        " address = $2, state = $3, reason = $4, topology = $5, boot_id = $6,"
        " last_heartbeat = now(), updated_at = now()",
        reg.node,
        reg.address,
        state,
        reason,
        list(reg.topology),
        reg.boot_id,
    )
    await conn.execute(
        "DELETE FROM gpus WHERE node = $1 AND NOT (idx = ANY($2::int[]))",
        reg.node,
        [g.index for g in reg.gpus],
    )
    await conn.executemany(
        "INSERT INTO gpus(node, idx, uuid, pci, model, memory_mib, locality, healthy)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, true) ON CONFLICT (node, idx) DO UPDATE SET"
        " uuid = $3, pci = $4, model = $5, memory_mib = $6, locality = $7, healthy = true",
        [(reg.node, g.index, g.uuid, g.pci, g.model, g.memory_mib, g.locality) for g in reg.gpus],
    )


async def set_state(conn: Conn, node: str, state: str, reason: str) -> None:
    await conn.execute(
        "UPDATE nodes SET state = $2, reason = $3, updated_at = now() WHERE name = $1",
        node,
        state,
        reason,
    )


async def record_fault(
    conn: Conn, node: str, gpu: int, xid: int, fault: dict[str, object], gpu_healthy: bool
) -> None:
    await conn.execute(
        "UPDATE nodes SET last_fault = $2::jsonb, fault_count = fault_count + 1,"
        " updated_at = now() WHERE name = $1",
        node,
        json.dumps(fault),
    )
    await conn.execute(
        "UPDATE gpus SET last_xid = $3, healthy = healthy AND $4 WHERE node = $1 AND idx = $2",
        node,
        gpu,
        xid,
        gpu_healthy,
    )


async def touch_heartbeats(conn: Conn, seen: Iterable[tuple[str, datetime]]) -> None:
    await conn.executemany(
        "UPDATE nodes SET last_heartbeat = $2 WHERE name = $1 AND"
        " (last_heartbeat IS NULL OR last_heartbeat < $2)",
        list(seen),
    )


async def live_nodes(conn: Conn) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT name, state, last_heartbeat FROM nodes WHERE state IN ('UP', 'DRAINING', 'DRAINED')"
    )


async def job_on_gpu(conn: Conn, node: str, gpu: int) -> int | None:
    job_id: int | None = await conn.fetchval(
        "SELECT a.job_id FROM allocation_gpus g JOIN allocations a USING (alloc_id)"
        " WHERE g.node = $1 AND g.gpu = $2 AND g.live",
        node,
        gpu,
    )
    return job_id


async def node_busy(conn: Conn, node: str) -> bool:
    busy = await conn.fetchval(
        "SELECT true FROM allocation_nodes WHERE node = $1 AND live LIMIT 1", node
    )
    return bool(busy)
