"""Launcher SQL for the level-triggered repairs: the placer's live allocations as rows
(read only; the placer owns them), the launcher's `node_cleanings` and its mailbox of
events parked for another replica's jobs. Every function
runs inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from services.launcher.reconcile_core import AllocationRow, RunRow
from shared.db import Conn
from shared.events import AnyEvent, Event, RunningWorker, decode, encode
from shared.states import LIVE_RUN, JobState

_WORKERS = msgspec.json.Decoder(tuple[RunningWorker, ...])

_ALLOCATIONS = (
    "SELECT a.job_id, a.attempt, array_agg(n.node ORDER BY n.rank) AS nodes,"
    " array_agg(array_to_json(n.gpus)::text ORDER BY n.rank) AS gpus,"
    " extract(epoch FROM now() - a.created_at)::float8 AS age_s"
    " FROM allocations a JOIN allocation_nodes n USING (alloc_id)"
    " WHERE a.released_at IS NULL AND n.live"
)


def _allocation(row: asyncpg.Record) -> AllocationRow:
    nodes, gpus = row["nodes"], row["gpus"]
    return AllocationRow(
        job_id=row["job_id"],
        attempt=row["attempt"],
        age_s=row["age_s"],
        gpus={n: msgspec.json.decode(g, type=list[int]) for n, g in zip(nodes, gpus, strict=True)},
    )


async def live_allocation(conn: Conn, job_id: int, attempt: int) -> AllocationRow | None:
    """Allocation `attempt` of `job_id` if it is still live."""
    row = await conn.fetchrow(
        _ALLOCATIONS + " AND a.job_id = $1 AND a.attempt = $2"
        " GROUP BY a.job_id, a.attempt, a.created_at",
        job_id,
        attempt,
    )
    return None if row is None else _allocation(row)


async def live_allocations(conn: Conn) -> list[AllocationRow]:
    rows = await conn.fetch(_ALLOCATIONS + " GROUP BY a.job_id, a.attempt, a.created_at")
    return [_allocation(r) for r in rows]


async def allocation_is_live(conn: Conn, job_id: int, attempt: int) -> bool:
    found = await conn.fetchval(
        "SELECT true FROM allocations WHERE job_id = $1 AND attempt = $2 AND released_at IS NULL",
        job_id,
        attempt,
    )
    return bool(found)


async def run_rows(conn: Conn, job_ids: Sequence[int]) -> dict[int, RunRow]:
    """The runs of `job_ids` and every run whose workers may be on the machines."""
    rows = await conn.fetch(
        "SELECT job_id, attempt, restart_count, state, nodes FROM job_runs"
        " WHERE state = ANY($1::text[]) OR job_id = ANY($2::bigint[])",
        [str(s) for s in LIVE_RUN],
        list(job_ids),
    )
    return {r["job_id"]: _run_row(r) for r in rows}


def _run_row(r: asyncpg.Record) -> RunRow:
    return RunRow(
        job_id=r["job_id"],
        attempt=r["attempt"],
        generation=r["restart_count"],
        state=JobState(r["state"]),
        nodes=tuple(r["nodes"]),
    )


async def owe_cleaning(
    conn: Conn, node: str, boot_id: str, reported: tuple[RunningWorker, ...]
) -> None:
    """`node` (re)registered for `boot_id` reporting `reported`: it is owed an answer.
    A newer registration replaces an older one's: only the latest boot matters."""
    await conn.execute(
        "INSERT INTO node_cleanings(node, boot_id, reported) VALUES ($1, $2, $3::jsonb)"
        " ON CONFLICT (node) DO UPDATE SET boot_id = $2, reported = $3::jsonb,"
        " received_at = now(), tries = 0",
        node,
        boot_id,
        msgspec.json.encode(reported).decode(),
    )


async def cleanings_owed(conn: Conn) -> list[tuple[str, str, tuple[RunningWorker, ...]]]:
    rows = await conn.fetch("SELECT node, boot_id, reported FROM node_cleanings ORDER BY node")
    return [(r["node"], r["boot_id"], _WORKERS.decode(r["reported"])) for r in rows]


async def settle_cleaning(conn: Conn, node: str, boot_id: str) -> bool:
    """Drop the debt for `boot_id` (False: paid already, or a newer boot is owed)."""
    done = await conn.fetchval(
        "DELETE FROM node_cleanings WHERE node = $1 AND boot_id = $2 RETURNING true",
        node,
        boot_id,
    )
    return bool(done)


async def count_try(conn: Conn, node: str) -> None:
    await conn.execute("UPDATE node_cleanings SET tries = tries + 1 WHERE node = $1", node)


# --- the mailbox: events for jobs another replica owns (owners.py) ------------------


async def park(conn: Conn, job_id: int, event: Event) -> None:
    await conn.execute(
        "INSERT INTO launcher_mailbox(job_id, event) VALUES ($1, $2)", job_id, encode(event)
    )


async def parked(conn: Conn, shards: list[int], limit: int) -> list[tuple[int, int, AnyEvent]]:
    """The oldest events parked for jobs of `shards`: (row id, job id, event)."""
    rows = await conn.fetch(
        "SELECT id, job_id, event FROM launcher_mailbox"
        " WHERE launcher_shard(job_id) = ANY($1::int[]) ORDER BY id LIMIT $2",
        shards,
        limit,
    )
    return [(r["id"], r["job_id"], decode(r["event"])) for r in rows]


async def unpark(conn: Conn, row_id: int) -> None:
    await conn.execute("DELETE FROM launcher_mailbox WHERE id = $1", row_id)


async def resume_after_s(conn: Conn, job_id: int) -> float:
    """How long until a run's persisted backoff (`resume_at`) runs out; 0 if none."""
    left: float | None = await conn.fetchval(
        "SELECT extract(epoch FROM resume_at - now())::float8 FROM job_runs WHERE job_id = $1",
        job_id,
    )
    return max(0.0, left or 0.0)
