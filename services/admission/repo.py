"""Admission SQL: admission owns `jobs`; it reads the other tables to answer queries.
Functions run inside the caller's transaction (reads may run outside one)."""

from __future__ import annotations

import json

import asyncpg
import msgspec

from shared.db import Conn
from shared.jobspec import JobSpec


async def insert_job(conn: Conn, spec: JobSpec) -> int:
    job_id: int = await conn.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec, held, array_job_id, array_task_id)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13) RETURNING job_id",
        spec.name,
        spec.user,
        spec.account,
        spec.partition,
        spec.qos,
        spec.nodes_min,
        spec.nodes_max,
        spec.gpus_per_node,
        spec.time_limit_s,
        msgspec.json.encode(spec).decode(),
        spec.hold,
        spec.array_job_id,
        spec.array_task_id,
    )
    return job_id


async def set_array_job(conn: Conn, job_id: int, spec: JobSpec) -> None:
    await conn.execute(
        "UPDATE jobs SET array_job_id = $2, spec = $3::jsonb WHERE job_id = $1",
        job_id,
        spec.array_job_id,
        msgspec.json.encode(spec).decode(),
    )


async def node_shapes(conn: Conn) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT n.name, n.state, count(g.idx) AS gpus FROM nodes n"
        " LEFT JOIN gpus g ON g.node = n.name GROUP BY n.name ORDER BY n.name"
    )


async def owners(conn: Conn, job_ids: list[int]) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT job_id, user_name, cancel_requested_at IS NOT NULL AS cancelled"
        " FROM jobs WHERE job_id = ANY($1::bigint[]) FOR UPDATE",
        job_ids,
    )


async def select_jobs(conn: Conn, name: str | None, owner: str | None) -> list[int]:
    rows = await conn.fetch(
        "SELECT j.job_id FROM jobs j LEFT JOIN job_runs r USING (job_id)"
        " WHERE ($1::text IS NULL OR j.name = $1) AND ($2::text IS NULL OR j.user_name = $2)"
        " AND j.cancel_requested_at IS NULL"
        " AND (r.state IS NULL OR r.state NOT IN"
        "  ('COMPLETED','FAILED','CANCELLED','TIMEOUT','NODE_FAIL','OUT_OF_MEMORY','PREEMPTED'))",
        name,
        owner,
    )
    return [r["job_id"] for r in rows]


async def request_cancel(conn: Conn, job_id: int, reason: str) -> None:
    await conn.execute(
        "UPDATE jobs SET cancel_requested_at = now(), cancel_reason = $2"
        " WHERE job_id = $1 AND cancel_requested_at IS NULL",
        job_id,
        reason,
    )


async def set_held(conn: Conn, job_id: int, held: bool, reason: str) -> None:
    await conn.execute(
        "UPDATE jobs SET held = $2, hold_reason = $3 WHERE job_id = $1", job_id, held, reason
    )


JOB_VIEW = """
SELECT j.job_id, j.name, j.user_name, j.account, j.partition, j.qos, j.nodes_max,
       j.gpus_per_node, j.time_limit_s, j.held, j.array_job_id, j.array_task_id,
       extract(epoch FROM j.submitted_at)::float8 AS submitted,
       j.cancel_requested_at, j.cancel_reason,
       r.state AS run_state, r.reason AS run_reason, r.nodes AS run_nodes, r.exit_code,
       r.restart_count, extract(epoch FROM r.started_at)::float8 AS started,
       extract(epoch FROM r.ended_at)::float8 AS ended,
       p.reason AS wait_reason, p.detail AS wait_detail,
       extract(epoch FROM p.estimated_start)::float8 AS est,
       (SELECT array_agg(n.node ORDER BY n.rank) FROM allocations a
          JOIN allocation_nodes n ON n.alloc_id = a.alloc_id AND n.live
         WHERE a.job_id = j.job_id AND a.released_at IS NULL) AS alloc_nodes
  FROM jobs j
  LEFT JOIN job_runs r USING (job_id)
  LEFT JOIN pending_reasons p USING (job_id)
"""


async def job_rows(
    conn: Conn, job_ids: list[int] | None, users: list[str] | None
) -> list[asyncpg.Record]:
    where = []
    args: list[object] = []
    if job_ids:
        args.append(job_ids)
        where.append(f"j.job_id = ANY(${len(args)}::bigint[])")
    if users:
        args.append(users)
        where.append(f"j.user_name = ANY(${len(args)}::text[])")
    sql = JOB_VIEW + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY j.job_id"
    return await conn.fetch(sql, *args)


async def job_spec(conn: Conn, job_id: int) -> dict[str, object] | None:
    raw = await conn.fetchval("SELECT spec FROM jobs WHERE job_id = $1", job_id)
    return None if raw is None else dict(json.loads(raw))


async def attempts(conn: Conn, job_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT attempt, seq, nodes, world_size, reason, outcome,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM ended_at)::float8 AS ended"
        " FROM attempts WHERE job_id = $1 ORDER BY attempt, seq",
        job_id,
    )


async def nodes_view(conn: Conn) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    nodes = await conn.fetch(
        "SELECT name, state, reason, topology, extract(epoch FROM last_heartbeat)::float8 AS hb,"
        " last_fault FROM nodes ORDER BY name"
    )
    gpus = await conn.fetch(
        "SELECT g.node, g.idx, g.model, g.healthy, g.last_xid, a.job_id FROM gpus g"
        " LEFT JOIN allocation_gpus ag ON ag.node = g.node AND ag.gpu = g.idx AND ag.live"
        " LEFT JOIN allocations a ON a.alloc_id = ag.alloc_id ORDER BY g.node, g.idx"
    )
    return nodes, gpus
