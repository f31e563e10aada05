"""Launcher SQL: the coordinator owns `job_runs`, `attempts` and `worker_exits`.
Every function runs inside the caller's transaction."""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg
import msgspec

from shared.db import Conn
from shared.jobspec import JobSpec

TERMINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
)
ACTIVE = ("STARTING", "RUNNING", "COMPLETING")


class Run(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    state: str
    attempt: int
    restart_count: int
    nodes: tuple[str, ...]
    gpus: dict[str, list[int]]
    excluded: tuple[str, ...]
    started_at: datetime | None
    gpu_seconds: float
    segment_start: datetime | None
    segment_gpus: int
    stopping_to: str | None = None

    def used_gpu_seconds(self, now: datetime) -> float:
        """Charged so far: closed segments plus the running one."""
        if self.segment_start is None:
            return self.gpu_seconds
        return self.gpu_seconds + self.segment_gpus * max(
            0.0, (now - self.segment_start).total_seconds()
        )


def _run(row: asyncpg.Record) -> Run:
    return Run(
        job_id=row["job_id"],
        state=row["state"],
        attempt=row["attempt"],
        restart_count=row["restart_count"],
        nodes=tuple(row["nodes"]),
        gpus=json.loads(row["gpus"]),
        excluded=tuple(row["excluded_nodes"]),
        started_at=row["started_at"],
        gpu_seconds=row["gpu_seconds"],
        segment_start=row["segment_start"],
        segment_gpus=row["segment_gpus"],
        stopping_to=row["stopping_to"],
    )


async def lock_run(conn: Conn, job_id: int) -> Run | None:
    row = await conn.fetchrow("SELECT * FROM job_runs WHERE job_id = $1 FOR UPDATE", job_id)
    return None if row is None else _run(row)


async def load_spec(conn: Conn, job_id: int) -> tuple[JobSpec, bool] | None:
    """The job's spec and whether a cancel was requested."""
    row = await conn.fetchrow(
        "SELECT spec, cancel_requested_at IS NOT NULL AS cancelled FROM jobs WHERE job_id = $1",
        job_id,
    )
    if row is None:
        return None
    return msgspec.json.decode(row["spec"], type=JobSpec), bool(row["cancelled"])


async def node_addresses(conn: Conn, nodes: list[str]) -> dict[str, str]:
    rows = await conn.fetch("SELECT name, address FROM nodes WHERE name = ANY($1::text[])", nodes)
    return {r["name"]: r["address"] for r in rows}


async def gpu_model(conn: Conn, nodes: list[str]) -> str:
    model: str | None = await conn.fetchval(
        "SELECT model FROM gpus WHERE node = ANY($1::text[]) LIMIT 1", nodes
    )
    return model or ""


async def start_run(
    conn: Conn, job_id: int, attempt: int, gpus: dict[str, list[int]], excluded: tuple[str, ...]
) -> Run:
    row = await conn.fetchrow(
        "INSERT INTO job_runs(job_id, state, attempt, nodes, gpus, excluded_nodes, world_size)"
        " VALUES ($1, 'STARTING', $2, $3, $4::jsonb, $5, $6)"
        " ON CONFLICT (job_id) DO UPDATE SET state = 'STARTING', attempt = $2, nodes = $3,"
        " gpus = $4::jsonb, world_size = $6, reason = '', stopping_to = NULL, updated_at = now()"
        " RETURNING *",
        job_id,
        attempt,
        list(gpus),
        json.dumps(gpus),
        list(excluded),
        len(gpus),
    )
    assert row is not None
    return _run(row)


async def mark_running(conn: Conn, run: Run, now: datetime) -> None:
    gpus = sum(len(g) for g in run.gpus.values())
    await conn.execute(
        "UPDATE job_runs SET state = 'RUNNING', started_at = coalesce(started_at, $2),"
        " segment_start = $2, segment_gpus = $3, updated_at = now() WHERE job_id = $1",
        run.job_id,
        now,
        gpus,
    )
    await conn.execute(
        "INSERT INTO attempts(job_id, attempt, seq, nodes, world_size, reason, started_at)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        run.job_id,
        run.attempt,
        run.restart_count,
        list(run.nodes),
        len(run.nodes),
        "start" if run.restart_count == 0 else "restart",
        now,
    )


async def reshape(
    conn: Conn, run: Run, gpus: dict[str, list[int]], reason: str, now: datetime
) -> Run:
    """Close the running segment and continue on `gpus` with the next generation."""
    used = run.used_gpu_seconds(now)
    await _close_attempt(conn, run, reason, now)
    row = await conn.fetchrow(
        "UPDATE job_runs SET restart_count = restart_count + 1, nodes = $2, gpus = $3::jsonb,"
        " world_size = $4, gpu_seconds = $5, segment_start = NULL, segment_gpus = 0,"
        " state = 'STARTING', reason = $6, updated_at = now() WHERE job_id = $1 RETURNING *",
        run.job_id,
        list(gpus),
        json.dumps(gpus),
        len(gpus),
        used,
        reason,
    )
    assert row is not None
    return _run(row)


async def finish(
    conn: Conn,
    run: Run,
    state: str,
    reason: str,
    now: datetime,
    *,
    exit_code: int | None = None,
    signal: int | None = None,
    exclude: tuple[str, ...] = (),
) -> float:
    """End the run (terminal, or REQUEUED); returns the GPU-seconds it used in total."""
    used = run.used_gpu_seconds(now)
    await _close_attempt(conn, run, reason, now)
    requeue = state == "REQUEUED"
    await conn.execute(
        "UPDATE job_runs SET state = $2, reason = $3, exit_code = $4, signal = $5,"
        " gpu_seconds = $6, segment_start = NULL, segment_gpus = 0,"
        " ended_at = CASE WHEN $7 THEN NULL ELSE $8::timestamptz END,"
        " restart_count = restart_count + CASE WHEN $7 THEN 1 ELSE 0 END,"
        " excluded_nodes = coalesce((SELECT array_agg(DISTINCT n)"
        "   FROM unnest(excluded_nodes || $9::text[]) n), '{}'),"
        " updated_at = now() WHERE job_id = $1",
        run.job_id,
        state,
        reason,
        exit_code,
        signal,
        used,
        requeue,
        now,
        list(exclude),
    )
    return used


async def finish_unstarted(conn: Conn, job_id: int, state: str, reason: str, now: datetime) -> None:
    await conn.execute(
        "INSERT INTO job_runs(job_id, state, reason, ended_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (job_id) DO UPDATE SET state = $2, reason = $3, ended_at = $4,"
        " updated_at = now()",
        job_id,
        state,
        reason,
        now,
    )


async def _close_attempt(conn: Conn, run: Run, outcome: str, now: datetime) -> None:
    await conn.execute(
        "UPDATE attempts SET outcome = $4, ended_at = $5"
        " WHERE job_id = $1 AND attempt = $2 AND seq = $3 AND ended_at IS NULL",
        run.job_id,
        run.attempt,
        run.restart_count,
        outcome,
        now,
    )


async def record_exit(
    conn: Conn,
    job_id: int,
    attempt: int,
    generation: int,
    node: str,
    code: int | None,
    sig: int | None,
) -> list[asyncpg.Record]:
    """Record one node's exit; returns every exit of that generation so far."""
    await conn.execute(
        "INSERT INTO worker_exits(job_id, attempt, generation, node, exit_code, signal)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        job_id,
        attempt,
        generation,
        node,
        code,
        sig,
    )
    return await conn.fetch(
        "SELECT node, exit_code, signal FROM worker_exits"
        " WHERE job_id = $1 AND attempt = $2 AND generation = $3",
        job_id,
        attempt,
        generation,
    )


async def runs_on_node(conn: Conn, node: str) -> list[int]:
    rows = await conn.fetch(
        "SELECT job_id FROM job_runs WHERE state = ANY($2::text[]) AND $1 = ANY(nodes)",
        node,
        list(ACTIVE),
    )
    return [r["job_id"] for r in rows]


async def active_runs(conn: Conn) -> list[Run]:
    rows = await conn.fetch("SELECT * FROM job_runs WHERE state = ANY($1::text[])", list(ACTIVE))
    return [_run(r) for r in rows]


async def overdue(conn: Conn) -> list[int]:
    rows = await conn.fetch(
        "SELECT r.job_id FROM job_runs r JOIN jobs j USING (job_id) WHERE r.state = 'RUNNING'"
        " AND r.started_at + make_interval(secs => j.time_limit_s) < now()"
    )
    return [r["job_id"] for r in rows]


async def begin_stopping(conn: Conn, job_id: int, to_state: str, reason: str) -> None:
    await conn.execute(
        "UPDATE job_runs SET state = 'COMPLETING', stopping_to = $2, reason = $3,"
        " stopping_since = now(), updated_at = now() WHERE job_id = $1",
        job_id,
        to_state,
        reason,
    )


async def stuck_stopping(conn: Conn, after_s: float) -> list[int]:
    rows = await conn.fetch(
        "SELECT job_id FROM job_runs WHERE state = 'COMPLETING'"
        " AND stopping_since < now() - make_interval(secs => $1)",
        after_s,
    )
    return [r["job_id"] for r in rows]
