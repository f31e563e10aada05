"""Placer SQL, what the placer writes: allocations (and their release), pending
reasons, cycle records, preemptions and spare swaps.

Every function takes a connection already inside a transaction that holds the lease
(`lease.lock_lease`); the `allocations` trigger refuses an insert from a stale epoch and
the unique index on live GPUs refuses a GPU held twice, whatever this code does.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import msgspec

from services.placer.core import Grant, Start, Wait
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.states import LIVE_RUN, TERMINAL, JobState

# state sets as query parameters (`= ANY($n::text[])`)
TERMINAL_STATES = sorted(TERMINAL)
LIVE_STATES = sorted(LIVE_RUN)


# An allocation ends with its run (ended for good, or requeued past it) or with its
# job's cancel once no run of it is live; its GPUs and nodes are freed with it. One
# statement: it runs at the top of every cycle, on every start's path.
RELEASE_FINISHED = """
WITH ended AS (
    SELECT a.alloc_id,
           CASE WHEN r.state = ANY($1::text[]) OR (r.state = $2 AND r.attempt >= a.attempt)
                THEN r.state ELSE $3 END AS reason
    FROM allocations a JOIN jobs j USING (job_id) LEFT JOIN job_runs r USING (job_id)
    WHERE a.released_at IS NULL
      AND (r.state = ANY($1::text[]) OR (r.state = $2 AND r.attempt >= a.attempt)
           OR (j.cancel_requested_at IS NOT NULL
               AND NOT coalesce(r.attempt = a.attempt AND r.state = ANY($4::text[]), false)))
), released AS (
    UPDATE allocations a SET released_at = now(), release_reason = e.reason
    FROM ended e WHERE a.alloc_id = e.alloc_id
    RETURNING a.alloc_id
), gpus AS (
    UPDATE allocation_gpus SET live = false WHERE alloc_id IN (SELECT alloc_id FROM released)
), nodes AS (
    UPDATE allocation_nodes SET live = false WHERE alloc_id IN (SELECT alloc_id FROM released)
)
SELECT count(*) FROM released
"""

# After a shrink: a node the running generation no longer lists is given back (with its
# GPUs), unless it is a spare granted in the last minute that the job's restart has not
# listed yet; a spare the run lists is settled. The two touch disjoint rows (a node in
# the run's list, a node not in it), so one statement does both.
RELEASE_DROPPED = """
WITH settled AS (
    UPDATE allocation_nodes n SET spare_pending = false FROM allocations a, job_runs r
    WHERE n.alloc_id = a.alloc_id AND n.spare_pending AND r.job_id = a.job_id
      AND n.node = ANY(r.nodes)
), dropped AS (
    UPDATE allocation_nodes n SET live = false, dropped_at = now() FROM allocations a, job_runs r
    WHERE n.alloc_id = a.alloc_id AND a.released_at IS NULL AND n.live
      AND (NOT n.spare_pending OR n.added_at < now() - interval '60 seconds')
      AND r.job_id = a.job_id AND r.attempt = a.attempt AND r.state = $1
      AND cardinality(r.nodes) > 0 AND NOT (n.node = ANY(r.nodes))
    RETURNING n.alloc_id, n.node
), gpus AS (
    UPDATE allocation_gpus g SET live = false FROM dropped d
    WHERE g.alloc_id = d.alloc_id AND g.node = d.node
)
SELECT count(*) FROM dropped
"""


async def release_finished(conn: Conn) -> int:
    """Release allocations whose run ended or was requeued, or whose job was cancelled
    with no run of it live (level-triggered); how many."""
    released: int = await conn.fetchval(
        RELEASE_FINISHED, TERMINAL_STATES, JobState.REQUEUED, JobState.CANCELLED, LIVE_STATES
    )
    return released


async def release_dropped_nodes(conn: Conn) -> int:
    """Give back the nodes an elastic job no longer runs on after a shrink. A granted
    spare is kept until the job's run lists it (its restart onto the spare)."""
    dropped: int = await conn.fetchval(RELEASE_DROPPED, JobState.RUNNING)
    return dropped


_INSERT_ALLOCATION = """
WITH a AS (
    INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, $2, $3) RETURNING alloc_id
), n AS (
    INSERT INTO allocation_nodes(alloc_id, node, rank, gpus)
    SELECT a.alloc_id, x.node, x.rank - 1, x.gpus::int[]
    FROM a, unnest($4::text[], $5::text[]) WITH ORDINALITY AS x(node, gpus, rank)
), g AS (
    INSERT INTO allocation_gpus(alloc_id, node, gpu)
    SELECT a.alloc_id, y.node, y.gpu FROM a, unnest($6::text[], $7::int[]) AS y(node, gpu)
), d AS (
    DELETE FROM pending_reasons WHERE job_id = $1
)
SELECT alloc_id FROM a
"""


async def insert_allocation(conn: Conn, start: Start, attempt: int, epoch: int) -> int:
    """Write one gang's allocation (one statement: it is on every start's path); the
    unique index refuses a GPU held twice."""
    held = [(g.node, gpu) for g in start.grants for gpu in g.gpus]
    alloc_id: int = await conn.fetchval(
        _INSERT_ALLOCATION,
        start.job_id,
        attempt,
        epoch,
        [g.node for g in start.grants],
        ["{" + ",".join(map(str, g.gpus)) + "}" for g in start.grants],
        [node for node, _ in held],
        [gpu for _, gpu in held],
    )
    return alloc_id


async def write_predictions(conn: Conn, ends: Mapping[int, tuple[float, str]]) -> None:
    """Running jobs' predicted ends and why, on their live allocations."""
    await conn.executemany(
        "UPDATE allocations SET predicted_end = to_timestamp($2), predicted_why = $3"
        " WHERE job_id = $1 AND released_at IS NULL",
        [(job_id, end, why) for job_id, (end, why) in ends.items()],
    )


async def write_waits(conn: Conn, waits: tuple[Wait, ...]) -> None:
    await conn.executemany(
        "INSERT INTO pending_reasons(job_id, reason, detail, estimated_start, updated_at)"
        " VALUES ($1, $2, $3, $4, now()) ON CONFLICT (job_id) DO UPDATE SET"
        " reason = excluded.reason, detail = excluded.detail,"
        " estimated_start = excluded.estimated_start, updated_at = now()",
        [
            (
                w.job_id,
                str(w.reason),
                w.detail,
                datetime.fromtimestamp(w.estimated_start, UTC) if w.estimated_start else None,
            )
            for w in waits
        ],
    )


# The cycle log is a record of its own: kept as long as the events (`shared/retention.py`),
# the oldest cycles read first by key (epoch, cycle: in time order, a new leader's epoch
# is higher), at most $2 of them a statement.
PRUNE_CYCLES = """
DELETE FROM placer_cycles WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM (
    SELECT ctid, started_at FROM placer_cycles
     ORDER BY epoch, cycle LIMIT $2 FOR UPDATE SKIP LOCKED
  ) head WHERE started_at < now() - make_interval(secs => $1)
))
"""


async def record_cycle(
    conn: Conn,
    epoch: int,
    cycle: int,
    started: datetime,
    duration_s: float,
    placed: int,
    pending: int,
) -> None:
    await conn.execute(
        "INSERT INTO placer_cycles VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        epoch,
        cycle,
        started,
        duration_s,
        placed,
        pending,
    )


async def record_preemption(conn: Conn, victim_job_id: int, for_job_id: int, epoch: int) -> bool:
    """Note that the victim's live allocation is being preempted; False when it was
    already asked (the launcher is giving it its grace time)."""
    row = await conn.fetchval(
        "INSERT INTO preemptions(victim_alloc_id, victim_job_id, for_job_id, epoch)"
        " SELECT alloc_id, job_id, $2, $3 FROM allocations"
        " WHERE job_id = $1 AND released_at IS NULL"
        " ON CONFLICT DO NOTHING RETURNING true",
        victim_job_id,
        for_job_id,
        epoch,
    )
    return bool(row)


# One statement, as the insert is: the GPU and node rows, then the allocation they name.
_WITHDRAW = """
WITH g AS (
    DELETE FROM allocation_gpus WHERE alloc_id = $1
), n AS (
    DELETE FROM allocation_nodes WHERE alloc_id = $1
)
DELETE FROM allocations WHERE alloc_id = $1
"""


async def withdraw_allocation(conn: Conn, alloc_id: int) -> None:
    """Remove an allocation this cycle wrote for a job whose placement fields changed
    meanwhile (`changed_since`): it was planned by the old ones. Nothing has seen it."""
    await conn.execute(_WITHDRAW, alloc_id)


class LiveAllocation(msgspec.Struct, frozen=True, kw_only=True):
    alloc_id: int
    attempt: int
    nodes: tuple[str, ...]
    spec: JobSpec


async def live_allocation(conn: Conn, job_id: int) -> LiveAllocation | None:
    row = await conn.fetchrow(
        "SELECT a.alloc_id, a.attempt, j.spec,"
        " array(SELECT n.node FROM allocation_nodes n WHERE n.alloc_id = a.alloc_id AND n.live"
        "   ORDER BY n.rank) AS nodes"
        " FROM allocations a JOIN jobs j USING (job_id)"
        " WHERE a.job_id = $1 AND a.released_at IS NULL",
        job_id,
    )
    if row is None:
        return None
    return LiveAllocation(
        alloc_id=row["alloc_id"],
        attempt=row["attempt"],
        nodes=tuple(row["nodes"]),
        spec=msgspec.json.decode(row["spec"], type=JobSpec),
    )


async def swap_nodes(
    conn: Conn, alloc_id: int, drop: tuple[str, ...], add: tuple[Grant, ...]
) -> None:
    """Replace lost nodes of a live allocation with spares; the unique index on live
    GPUs still refuses any GPU held twice."""
    await conn.execute(
        "UPDATE allocation_nodes SET live = false, dropped_at = now()"
        " WHERE alloc_id = $1 AND node = ANY($2::text[]) AND live",
        alloc_id,
        list(drop),
    )
    await conn.execute(
        "UPDATE allocation_gpus SET live = false WHERE alloc_id = $1 AND node = ANY($2::text[])",
        alloc_id,
        list(drop),
    )
    top = await conn.fetchval(
        "SELECT coalesce(max(rank), -1) FROM allocation_nodes WHERE alloc_id = $1", alloc_id
    )
    await conn.executemany(
        "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus, spare_pending)"
        " VALUES ($1, $2, $3, $4, true) ON CONFLICT (alloc_id, node) DO UPDATE SET"
        " live = true, rank = excluded.rank, gpus = excluded.gpus, spare_pending = true,"
        " added_at = now(), dropped_at = NULL",
        [(alloc_id, g.node, top + 1 + i, list(g.gpus)) for i, g in enumerate(add)],
    )
    await conn.executemany(
        "INSERT INTO allocation_gpus(alloc_id, node, gpu) VALUES ($1, $2, $3)"
        " ON CONFLICT (alloc_id, node, gpu) DO UPDATE SET live = true",
        [(alloc_id, g.node, gpu) for g in add for gpu in g.gpus],
    )
