"""Fairshare SQL. Every function takes a connection already inside a transaction.

The fairshare service writes `usage`, `usage_hours`, `usage_charges`, `fairshare_state`
and `job_priorities`; it reads `jobs`, `job_runs`, `attempts`, `allocations*` and `gpus`
to rank pending jobs and to answer `muster acct`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import msgspec

from services.fairshare.accounting import AttemptCharge, Charge
from services.fairshare.priority import PriorityBreakdown
from services.fairshare.ranking import PendingJob
from services.fairshare.report import HourlyUsage
from services.fairshare.sizes_report import AllocatedTime
from services.fairshare.tree import Assoc
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.retention import trim_oldest
from shared.usage_sql import used_by_attempt
from shared.waiting import fetch_waiting

# The hourly usage older than the fairshare service keeps (`MUSTER_USAGE_KEEP_S`), from
# the head of its key (hour first). The hour being charged now is never this old (the
# setting is floored at a day).
PRUNE_USAGE_HOURS = trim_oldest("usage_hours", "hour")


async def lock_charge(
    conn: Conn, job_id: int, attempt: int, user: str, account: str
) -> AttemptCharge:
    """The attempt's charge state, locked until commit (created empty the first time)."""
    await conn.execute(
        "INSERT INTO usage_charges(job_id, attempt, user_name, account) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT DO NOTHING",
        job_id,
        attempt,
        user,
        account,
    )
    row = await conn.fetchrow(
        "SELECT * FROM usage_charges WHERE job_id = $1 AND attempt = $2 FOR UPDATE",
        job_id,
        attempt,
    )
    assert row is not None
    return AttemptCharge(
        job_id=row["job_id"],
        attempt=row["attempt"],
        user=row["user_name"],
        account=row["account"],
        charged=row["charged"],
        billed=row["billed"],
        last_at=row["last_at"],
        settled=row["settled"],
        gpu_model=row["gpu_model"],
    )


async def save_charge(conn: Conn, state: AttemptCharge) -> None:
    await conn.execute(
        "UPDATE usage_charges SET charged = $3, billed = $4, last_at = $5, settled = $6,"
        " gpu_model = $7, updated_at = now() WHERE job_id = $1 AND attempt = $2",
        state.job_id,
        state.attempt,
        state.charged,
        state.billed,
        state.last_at,
        state.settled,
        state.gpu_model,
    )


async def add_usage(conn: Conn, charge: Charge) -> None:
    """Add a charge to the user association (raw, billed, and decayed-billed usage) and
    to the hour its tick ended in (`usage_hours`), in one statement."""
    await conn.execute(
        "WITH hourly AS (INSERT INTO usage_hours(hour, account, user_name, gpu_seconds, billed)"
        " VALUES (date_trunc('hour', to_timestamp($5)), $2, $1, $3, $4)"
        " ON CONFLICT (hour, account, user_name) DO UPDATE SET"
        " gpu_seconds = usage_hours.gpu_seconds + $3, billed = usage_hours.billed + $4)"
        " INSERT INTO usage(user_name, account, gpu_seconds, billed, decayed)"
        " VALUES ($1, $2, $3, $4, $4) ON CONFLICT (user_name, account) DO UPDATE SET"
        " gpu_seconds = usage.gpu_seconds + $3, billed = usage.billed + $4,"
        " decayed = usage.decayed + $4, updated_at = now()",
        charge.user,
        charge.account,
        charge.gpu_seconds,
        charge.billed,
        charge.at,
    )


async def gpu_time_by_state(conn: Conn, since: float, until: float) -> dict[str, float]:
    """The cluster's GPU-seconds per state over the whole hours from `since`'s to before
    `until` (`cluster_hours`, the health monitor's)."""
    rows = await conn.fetch(
        "SELECT state, sum(gpu_seconds) AS s FROM cluster_hours"
        " WHERE hour >= date_trunc('hour', to_timestamp($1)) AND hour < to_timestamp($2)"
        " GROUP BY state",
        since,
        until,
    )
    return {r["state"]: float(r["s"]) for r in rows}


# Each allocation that lived in the window (placed before its end, released after its
# start or still live): its job, account, the GPUs it was placed with (its size), and
# the GPU-seconds inside the window of each node while the allocation held it (a node a
# shrink gave back or a spare replaced counts to that moment, a spare from its own).
_ALLOCATED = """
SELECT a.job_id, j.account,
       (SELECT coalesce(sum(cardinality(n.gpus)), 0) FROM allocation_nodes n
        WHERE n.alloc_id = a.alloc_id AND n.added_at <= a.created_at)::int AS gpus,
       (SELECT coalesce(sum(cardinality(n.gpus) * greatest(0, extract(epoch FROM
                  least(coalesce(n.dropped_at, a.released_at, now()), to_timestamp($2))
                  - greatest(n.added_at, to_timestamp($1))))), 0)
        FROM allocation_nodes n WHERE n.alloc_id = a.alloc_id)::float8 AS gpu_seconds
FROM allocations a JOIN jobs j USING (job_id)
WHERE (a.released_at > to_timestamp($1) OR a.released_at IS NULL)
  AND a.created_at < to_timestamp($2)
"""


async def allocated_in(conn: Conn, since: float, until: float) -> list[AllocatedTime]:
    """Every allocation's GPU-seconds inside the window (epoch seconds)."""
    rows = await conn.fetch(_ALLOCATED, since, until)
    return [
        AllocatedTime(
            job_id=r["job_id"],
            account=r["account"],
            gpus=r["gpus"],
            gpu_seconds=r["gpu_seconds"],
        )
        for r in rows
    ]


async def usage_by_hour(
    conn: Conn, since: float, until: float, accounts: Sequence[str], users: Sequence[str]
) -> list[HourlyUsage]:
    """Usage per user association over the whole hours from `since`'s to before `until`
    (both epoch seconds): `since` is rounded down to its hour, `until` up."""
    rows = await conn.fetch(
        "SELECT account, user_name, sum(gpu_seconds) AS gpu_seconds, sum(billed) AS billed"
        " FROM usage_hours WHERE hour >= date_trunc('hour', to_timestamp($1))"
        " AND hour < to_timestamp($2)"
        " AND (cardinality($3::text[]) = 0 OR account = ANY($3))"
        " AND (cardinality($4::text[]) = 0 OR user_name = ANY($4))"
        " GROUP BY account, user_name",
        since,
        until,
        list(accounts),
        list(users),
    )
    return [
        HourlyUsage(
            account=r["account"],
            user=r["user_name"],
            gpu_seconds=float(r["gpu_seconds"]),
            billed=float(r["billed"]),
        )
        for r in rows
    ]


async def load_usage(conn: Conn) -> dict[Assoc, float]:
    """Decayed billed usage per user association."""
    rows = await conn.fetch("SELECT user_name, account, decayed FROM usage")
    return {Assoc(r["account"], r["user_name"]): float(r["decayed"]) for r in rows}


async def lock_decay_state(conn: Conn) -> tuple[float, float | None]:
    """(decayed_at, last_reset) as epoch seconds, locked so one replica decays at a time."""
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM decayed_at)::float8 AS decayed_at,"
        " extract(epoch FROM last_reset)::float8 AS last_reset"
        " FROM fairshare_state WHERE id = 1 FOR UPDATE"
    )
    assert row is not None
    return float(row["decayed_at"]), row["last_reset"]


async def apply_decay(
    conn: Conn, factor: float, now: float, *, reset: bool, last_reset: float | None
) -> None:
    """Multiply every decayed usage by `factor` (0 for a reset), in place, so a charge
    committed concurrently is never lost (both take the row lock)."""
    if reset or factor != 1.0:
        await conn.execute("UPDATE usage SET decayed = decayed * $1", 0.0 if reset else factor)
    await conn.execute(
        "UPDATE fairshare_state SET decayed_at = $1, last_reset = $2 WHERE id = 1",
        datetime.fromtimestamp(now, UTC),
        None if last_reset is None else datetime.fromtimestamp(last_reset, UTC),
    )


async def load_pending(conn: Conn) -> list[PendingJob]:
    """Jobs waiting for an allocation (what the placer ranks)."""
    rows = await fetch_waiting(
        conn, "j.job_id, j.spec, extract(epoch FROM j.submitted_at)::float8 AS submitted"
    )
    return [
        PendingJob(
            job_id=r["job_id"],
            spec=msgspec.json.decode(r["spec"], type=JobSpec),
            submitted_at=float(r["submitted"]),
        )
        for r in rows
    ]


async def cluster_gpus(conn: Conn) -> int:
    count: int = await conn.fetchval("SELECT count(*) FROM gpus")
    return count


async def lock_priorities(conn: Conn) -> None:
    """One replica's priority pass at a time, for the rest of this transaction: two
    passes that each replace the table would otherwise interleave (and may deadlock)."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('muster.fairshare.priorities'))")


async def write_priorities(conn: Conn, priorities: Sequence[tuple[int, PriorityBreakdown]]) -> None:
    """Replace the table with the priorities of the jobs pending now."""
    await conn.execute(
        "DELETE FROM job_priorities WHERE NOT (job_id = ANY($1::bigint[]))",
        [job_id for job_id, _ in priorities],
    )
    await conn.executemany(
        "INSERT INTO job_priorities(job_id, total, factors, updated_at)"
        " VALUES ($1, $2, $3::jsonb, now()) ON CONFLICT (job_id) DO UPDATE SET"
        " total = excluded.total, factors = excluded.factors, updated_at = now()",
        [(job_id, b.total, msgspec.json.encode(b).decode()) for job_id, b in priorities],
    )


# --- accounting (muster acct) ---------------------------------------------------------


_JOBS = f"""
SELECT j.job_id, j.name, j.user_name, j.account, j.partition, j.spec,
       extract(epoch FROM j.submitted_at)::float8 AS submit,
       j.cancel_requested_at IS NOT NULL AS cancelled,
       r.state, r.attempt AS current_attempt, r.exit_code, r.nodes AS run_nodes,
       extract(epoch FROM r.started_at)::float8 AS run_start,
       extract(epoch FROM r.ended_at)::float8 AS run_end,
       used.max_rss, used.max_rss_node, used.cpu_usec
FROM jobs j LEFT JOIN job_runs r USING (job_id)
LEFT JOIN LATERAL ({used_by_attempt("j.job_id", "r.attempt")}) used ON true
WHERE (cardinality($1::bigint[]) = 0 OR j.job_id = ANY($1::bigint[]))
  AND (cardinality($2::text[]) = 0 OR j.user_name = ANY($2::text[]))
  AND (cardinality($3::text[]) = 0 OR j.account = ANY($3::text[]))
  AND ($4::timestamptz IS NULL OR j.submitted_at >= $4 OR r.ended_at >= $4 OR r.ended_at IS NULL)
  AND ($5::timestamptz IS NULL OR j.submitted_at <= $5)
ORDER BY j.job_id DESC
LIMIT $6
"""

_ATTEMPTS = f"""
SELECT a.job_id, a.attempt,
       extract(epoch FROM a.created_at)::float8 AS allocated,
       extract(epoch FROM a.released_at)::float8 AS released,
       (SELECT count(*) FROM allocation_gpus g WHERE g.alloc_id = a.alloc_id) AS gpus,
       (SELECT coalesce(array_agg(n.node ORDER BY n.rank), '{{}}') FROM allocation_nodes n
         WHERE n.alloc_id = a.alloc_id) AS nodes,
       (SELECT extract(epoch FROM min(t.started_at))::float8 FROM attempts t
         WHERE t.job_id = a.job_id AND t.attempt = a.attempt) AS started,
       (SELECT extract(epoch FROM max(t.ended_at))::float8 FROM attempts t
         WHERE t.job_id = a.job_id AND t.attempt = a.attempt) AS ended,
       used.max_rss, used.max_rss_node, used.cpu_usec
FROM allocations a
LEFT JOIN LATERAL ({used_by_attempt("a.job_id", "a.attempt")}) used ON true
WHERE a.job_id = ANY($1::bigint[])
"""

_STEPS = """
SELECT job_id, step_id, argv, nodes, ntasks, state, exit_code, gpus::text AS gpus,
       extract(epoch FROM started_at)::float8 AS started,
       extract(epoch FROM ended_at)::float8 AS ended
FROM job_steps WHERE job_id = ANY($1::bigint[])
"""

_CHARGES = """
SELECT job_id, attempt, charged, billed, gpu_model FROM usage_charges
WHERE job_id = ANY($1::bigint[])
"""


def _ts(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


async def acct_records(
    conn: Conn,
    *,
    job_ids: Sequence[int] = (),
    users: Sequence[str] = (),
    accounts: Sequence[str] = (),
    since: float | None = None,
    until: float | None = None,
    limit: int = 1000,
) -> tuple[list[dict[str, object]], list[dict[str, object]], list[dict[str, object]]]:
    """Raw job, allocation-attempt and charge rows for `muster acct`, newest job first."""
    jobs = await conn.fetch(
        _JOBS, list(job_ids), list(users), list(accounts), _ts(since), _ts(until), limit
    )
    ids = [r["job_id"] for r in jobs]
    attempts = await conn.fetch(_ATTEMPTS, ids)
    charges = await conn.fetch(_CHARGES, ids)
    return [dict(r) for r in jobs], [dict(r) for r in attempts], [dict(r) for r in charges]


async def acct_steps(conn: Conn, job_ids: Sequence[int]) -> list[dict[str, object]]:
    """The srun steps of these jobs (the launcher's `job_steps`), for sacct's JOB.STEP."""
    return [dict(r) for r in await conn.fetch(_STEPS, list(job_ids))]
