"""Launcher SQL: the coordinator owns `job_runs`, `attempts` and `worker_exits`.
Every function runs inside the caller's transaction."""

from __future__ import annotations

import json
from datetime import datetime

import asyncpg
import msgspec

from services.launcher.reconcile_core import RunRow
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.states import LIVE_RUN, JobState

# Runs whose workers are, or may be, on the machines; the ones whose timers run.
ACTIVE = sorted(str(s) for s in LIVE_RUN)
TIMED = [str(JobState.STARTING), str(JobState.RUNNING)]


class Run(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    state: JobState
    attempt: int
    restart_count: int
    nodes: tuple[str, ...]
    gpus: dict[str, list[int]]
    excluded: tuple[str, ...]
    started_at: datetime | None
    gpu_seconds: float
    segment_start: datetime | None
    segment_gpus: int
    world_size: int = 0
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    stopping_to: str | None = None
    core: bytes | None = None  # the coordinator core's JobRun, msgspec JSON

    def used_gpu_seconds(self, now: datetime) -> float:
        """Charged so far: closed segments plus the running one."""
        if self.segment_start is None:
            return self.gpu_seconds
        return self.gpu_seconds + self.segment_gpus * max(
            0.0, (now - self.segment_start).total_seconds()
        )


def key_of(run: Run | None) -> RunRow | None:
    """What the reconcile core decides on of a run."""
    if run is None:
        return None
    return RunRow(
        job_id=run.job_id, attempt=run.attempt, generation=run.restart_count, state=run.state,
        nodes=run.nodes,
    )  # fmt: skip


def _run(row: asyncpg.Record) -> Run:
    return Run(
        job_id=row["job_id"],
        state=JobState(row["state"]),
        attempt=row["attempt"],
        restart_count=row["restart_count"],
        nodes=tuple(row["nodes"]),
        gpus=json.loads(row["gpus"]),
        excluded=tuple(row["excluded_nodes"]),
        started_at=row["started_at"],
        gpu_seconds=row["gpu_seconds"],
        segment_start=row["segment_start"],
        segment_gpus=row["segment_gpus"],
        world_size=row["world_size"],
        reason=row["reason"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        stopping_to=row["stopping_to"],
        core=None if row["core"] is None else row["core"].encode(),
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
    conn: Conn,
    run_id: tuple[int, int],
    gpus: dict[str, list[int]],
    *,
    restart_count: int,
    excluded: tuple[str, ...],
    reason: str,
    core: tuple[bytes, float | None],
) -> Run | None:
    """A new allocation's run: STARTING on `gpus` (node-rank order), with the
    coordinator core's state and its next timer (`core`, as `save_core` writes them).
    None: the row is not a requeued run of an earlier attempt (another launcher started
    this one)."""
    job_id, attempt = run_id
    state, due_at = core
    row = await conn.fetchrow(
        "INSERT INTO job_runs(job_id, state, attempt, nodes, gpus, excluded_nodes, world_size,"
        " restart_count, reason, core, due_at) VALUES ($1, 'STARTING', $2, $3, $4::jsonb, $5,"
        " $6, $7, $8, $9::jsonb, to_timestamp($10))"
        " ON CONFLICT (job_id) DO UPDATE SET state = 'STARTING', attempt = $2, nodes = $3,"
        " gpus = $4::jsonb, excluded_nodes = $5, world_size = $6, restart_count = $7,"
        " reason = $8, core = $9::jsonb, due_at = to_timestamp($10), stopping_to = NULL,"
        " exit_code = NULL, signal = NULL, resume_at = NULL,"
        # Usage is per allocation attempt: the last attempt was settled under its own key.
        " gpu_seconds = 0, segment_start = NULL, segment_gpus = 0, updated_at = now()"
        # The business key of a start, as reconcile_core.may_start: guards the write too.
        " WHERE job_runs.state = 'REQUEUED' AND job_runs.attempt < $2"
        " RETURNING *",
        job_id,
        attempt,
        list(gpus),
        json.dumps(gpus),
        list(excluded),
        len(gpus),
        restart_count,
        reason,
        state.decode(),
        due_at,
    )
    return None if row is None else _run(row)


async def save_core(conn: Conn, job_id: int, core: bytes, due_at: float | None) -> None:
    """The coordinator core's state of the run and when its next timer is due."""
    await conn.execute(
        "UPDATE job_runs SET core = $2::jsonb, due_at = to_timestamp($3) WHERE job_id = $1",
        job_id,
        core.decode(),
        due_at,
    )


async def resume_in(conn: Conn, job_id: int, delay_s: float) -> None:
    """A restart backoff or requeue delay: the run's next start (or end) is due then."""
    await conn.execute(
        "UPDATE job_runs SET resume_at = now() + make_interval(secs => $2) WHERE job_id = $1",
        job_id,
        delay_s,
    )


async def mark_running(conn: Conn, run: Run, now: datetime) -> None:
    """Every node started its worker: RUNNING, charged from now, one `attempts` row."""
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
        run.world_size,
        run.reason or "start",
        now,
    )


async def reshape(
    conn: Conn,
    run: Run,
    gpus: dict[str, list[int]],
    *,
    restart_count: int,
    world_size: int,
    reason: str,
    now: datetime,
) -> Run:
    """Close the running segment and continue on `gpus` with generation `restart_count`."""
    used = run.used_gpu_seconds(now)
    row = await conn.fetchrow(
        "UPDATE job_runs SET restart_count = $2, nodes = $3, gpus = $4::jsonb,"
        " world_size = $5, gpu_seconds = $6, segment_start = NULL, segment_gpus = 0,"
        " state = 'STARTING', reason = $7, updated_at = now() WHERE job_id = $1 RETURNING *",
        run.job_id,
        restart_count,
        list(gpus),
        json.dumps(gpus),
        world_size,
        used,
        reason,
    )
    assert row is not None
    return _run(row)


class Ending(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ends: a terminal state, or REQUEUED with the core's counts."""

    state: JobState
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int
    excluded: tuple[str, ...]


async def begin_stopping(conn: Conn, job_id: int, end: Ending) -> None:
    """COMPLETING: the GPUs stay held until the workers are gone, then `end` applies."""
    await conn.execute(
        "UPDATE job_runs SET state = 'COMPLETING', stopping_to = $2, reason = $3,"
        " exit_code = $4, signal = $5, restart_count = $6, excluded_nodes = $7,"
        " stopping_since = now(), due_at = NULL, updated_at = now() WHERE job_id = $1",
        job_id,
        end.state,
        end.reason,
        end.exit_code,
        end.signal,
        end.restart_count,
        list(end.excluded),
    )


def ending_of(run: Run) -> Ending:
    """The end a COMPLETING run was stopping towards."""
    return Ending(
        state=JobState(run.stopping_to or JobState.FAILED),
        reason=run.reason,
        exit_code=run.exit_code,
        signal=run.signal,
        restart_count=run.restart_count,
        excluded=run.excluded,
    )


async def finish(conn: Conn, run: Run, end: Ending, now: datetime) -> float:
    """End the run (terminal, or REQUEUED); returns the GPU-seconds it used in total."""
    used = run.used_gpu_seconds(now)
    requeue = end.state == JobState.REQUEUED
    await conn.execute(
        "UPDATE job_runs SET state = $2, reason = $3, exit_code = $4, signal = $5,"
        " gpu_seconds = $6, segment_start = NULL, segment_gpus = 0,"
        " ended_at = CASE WHEN $7 THEN NULL ELSE $8::timestamptz END,"
        " restart_count = $9, excluded_nodes = $10, stopping_to = NULL, due_at = NULL,"
        " updated_at = now() WHERE job_id = $1",
        run.job_id,
        end.state,
        end.reason,
        end.exit_code,
        end.signal,
        used,
        requeue,
        now,
        end.restart_count,
        list(end.excluded),
    )
    return used


async def finish_unstarted(
    conn: Conn, job_id: int, state: JobState, reason: str, now: datetime
) -> None:
    await conn.execute(
        "INSERT INTO job_runs(job_id, state, reason, ended_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (job_id) DO UPDATE SET state = $2, reason = $3, ended_at = $4,"
        " updated_at = now()",
        job_id,
        state,
        reason,
        now,
    )


async def close_attempt(
    conn: Conn,
    run_id: tuple[int, int],
    seq: int,
    closed: tuple[tuple[str, ...], int, datetime, datetime],
    outcome: str,
) -> None:
    """Record how generation `seq` of allocation `run_id` ended; a generation that never
    ran (its gang did not start) gets its row here, so the history shows it too."""
    nodes, world_size, started_at, ended_at = closed
    await conn.execute(
        "INSERT INTO attempts(job_id, attempt, seq, nodes, world_size, reason, outcome,"
        " started_at, ended_at) VALUES ($1, $2, $3, $4, $5, 'start', $6, $7, $8)"
        " ON CONFLICT (job_id, attempt, seq) DO UPDATE SET outcome = $6, ended_at = $8"
        " WHERE attempts.ended_at IS NULL",
        run_id[0],
        run_id[1],
        seq,
        list(nodes),
        world_size,
        outcome,
        started_at,
        ended_at,
    )


async def record_exit(
    conn: Conn,
    job_id: int,
    attempt: int,
    generation: int,
    node: str,
    code: int | None,
    sig: int | None,
    mem_peak_bytes: int | None = None,
    cpu_usec: int | None = None,
) -> list[asyncpg.Record]:
    """Record one node's exit (with the job's memory peak there, where its cgroup
    counted one); returns every exit of that generation so far."""
    await conn.execute(
        "INSERT INTO worker_exits(job_id, attempt, generation, node, exit_code, signal,"
        " mem_peak_bytes, cpu_usec) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        " ON CONFLICT DO NOTHING",
        job_id,
        attempt,
        generation,
        node,
        code,
        sig,
        mem_peak_bytes,
        cpu_usec,
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


async def due(conn: Conn) -> tuple[list[int], float | None]:
    """Runs whose next timer (settle, --signal, time limit) is due, and when the next
    one after those is due (epoch seconds)."""
    rows = await conn.fetch(
        "SELECT job_id, extract(epoch FROM due_at)::float8 AS at, due_at <= now() AS now"
        " FROM job_runs WHERE due_at IS NOT NULL AND state = ANY($1::text[])",
        TIMED,
    )
    later = [r["at"] for r in rows if not r["now"]]
    return [r["job_id"] for r in rows if r["now"]], min(later, default=None)


async def stuck_stopping(conn: Conn, after_s: float) -> list[int]:
    rows = await conn.fetch(
        "SELECT job_id FROM job_runs WHERE state = 'COMPLETING'"
        " AND stopping_since < now() - make_interval(secs => $1)",
        after_s,
    )
    return [r["job_id"] for r in rows]


async def add_gpus(conn: Conn, job_id: int, grants: dict[str, list[int]]) -> None:
    """Spares the placer added to the job's allocation, so the next generation can use
    their GPUs (the nodes themselves join when the generation starts)."""
    await conn.execute(
        "UPDATE job_runs SET gpus = gpus || $2::jsonb, updated_at = now() WHERE job_id = $1",
        job_id,
        json.dumps(grants),
    )


async def shrunk_elastic_runs(conn: Conn) -> list[tuple[Run, JobSpec]]:
    """Running elastic jobs on fewer nodes than their maximum."""
    rows = await conn.fetch(
        "SELECT r.*, j.spec AS job_spec FROM job_runs r JOIN jobs j USING (job_id)"
        " WHERE r.state = 'RUNNING' AND cardinality(r.nodes) < j.nodes_max"
        " AND j.nodes_min < j.nodes_max"
    )
    return [(_run(r), msgspec.json.decode(r["job_spec"], type=JobSpec)) for r in rows]
