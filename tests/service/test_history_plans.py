"""The reads a cluster makes every cycle do not grow with its history, on real
PostgreSQL: with 20,000 ended jobs recorded (their allocations, node and GPU rows kept
as the record) and three running, none of them reads a whole table of that history.
Each would have before its index (migration 0021: the release step's spare-pending
rows, health's live allocations per node) or its lookup by key (the queue's runs,
`shared/waiting.py`). Nor do the metrics every scrape reads from the events the
outbox keeps (migration 0022: the node faults' own index)."""

from __future__ import annotations

import asyncpg

from services.health.metrics import XIDS
from services.health.repo import LIVE_PER_NODE
from services.launcher.metrics import FAULT_TO_RESTART, RESTART_BUCKETS
from services.placer.repo.allocations import (
    LIVE_STATES,
    RELEASE_DROPPED,
    RELEASE_FINISHED,
    TERMINAL_STATES,
)
from shared.states import JobState
from shared.waiting import WAITING_FROM

ENDED, RUNNING = 20_000, 3
HISTORY = ("jobs", "job_runs", "allocations", "allocation_nodes", "allocation_gpus")

READS: list[tuple[str, str, tuple[object, ...]]] = [
    # the queue (placer, fairshare), never analyzed here: guessed at 2,260 rows
    (
        "the waiting jobs and their runs",
        f"SELECT j.job_id, r.state{WAITING_FROM}",
        (JobState.REQUEUED,),
    ),
    (
        "placer: release what ended",
        RELEASE_FINISHED,
        (TERMINAL_STATES, JobState.REQUEUED, JobState.CANCELLED, LIVE_STATES),
    ),
    ("placer: release dropped nodes", RELEASE_DROPPED, (JobState.RUNNING,)),
    ("health: live allocations per node", LIVE_PER_NODE, (["n1", "n2"],)),
]


async def record_history(db: asyncpg.Connection) -> None:
    """ENDED finished jobs and RUNNING live ones, one node and GPU each, in bulk (the
    rows as the services leave them; foreign keys and triggers off for the load)."""
    total = ENDED + RUNNING
    async with db.transaction():
        await db.execute("SET LOCAL session_replication_role = replica")
        await db.execute(
            "INSERT INTO jobs(job_id, name, user_name, account, partition, qos, nodes_min,"
            " nodes_max, gpus_per_node, time_limit_s, spec)"
            " SELECT i, 'train', 'alice', 'a', 'normal', 'normal', 1, 1, 1, 600, '{}'"
            " FROM generate_series(1, $1::int) i",
            total,
        )
        await db.execute(
            "INSERT INTO job_runs(job_id, state, attempt, nodes)"
            " SELECT i, CASE WHEN i > $2 THEN 'RUNNING' ELSE 'COMPLETED' END, 1,"
            " ARRAY['n' || (i % 8)] FROM generate_series(1, $1::int) i",
            total,
            ENDED,
        )
        await db.execute(
            "INSERT INTO allocations(alloc_id, job_id, attempt, epoch, released_at)"
            " SELECT i, i, 1, 1, CASE WHEN i > $2 THEN NULL ELSE now() END"
            " FROM generate_series(1, $1::int) i",
            total,
            ENDED,
        )
        for table, extra in (("allocation_nodes", ", rank, gpus"), ("allocation_gpus", ", gpu")):
            values = ", 0, '{0}'" if table == "allocation_nodes" else ", 0"
            await db.execute(
                f"INSERT INTO {table}(alloc_id, node{extra}, live)"
                f" SELECT i, 'n' || (i % 8){values}, i > $2 FROM generate_series(1, $1::int) i",
                total,
                ENDED,
            )
    await db.execute(f"ANALYZE {', '.join(HISTORY)}")


async def test_no_cycle_read_scans_the_history(db: asyncpg.Connection) -> None:
    await record_history(db)
    scanned = {}
    for what, sql, args in READS:
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN {sql}", *args))  # not run
        scans = [t for t in HISTORY if f"Seq Scan on {t} " in plan]
        if scans:
            scanned[what] = f"reads all of {scans}:\n{plan}"
    assert not scanned, "\n\n".join(f"{what} {why}" for what, why in scanned.items())


async def test_no_metric_reads_every_event_the_outbox_kept(db: asyncpg.Connection) -> None:
    """20,000 published events, 20 of them node faults: the fault metrics read those."""
    await db.execute(
        "INSERT INTO outbox(event_id, subject, payload, published_at)"
        " SELECT gen_random_uuid(), CASE WHEN i % 1000 = 0 THEN 'muster.node.fault'"
        " ELSE 'muster.job.started' END, convert_to('{\"job_id\": 1}', 'UTF8'), now()"
        " FROM generate_series(1, $1::int) i",
        ENDED,
    )
    await db.execute("ANALYZE outbox")
    reads = {"health: XIDs": (XIDS, ()), "launcher: fault to restart": (FAULT_TO_RESTART, (
        [float(b) for b in RESTART_BUCKETS],
    ))}  # fmt: skip
    for what, (sql, args) in reads.items():
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN {sql}", *args))
        assert "Seq Scan on outbox " not in plan, f"{what} reads every event:\n{plan}"
