"""The pruner (shared/retention.py) on real PostgreSQL: old published events and old
inbox rows go, in bounded batches; unpublished events, node faults and anything the
stream could still redeliver stay; two pruners at once share the work; and a pass reads
the head of an index, not the whole table."""

from __future__ import annotations

import asyncio

import asyncpg

from services.placer.repo import PRUNE_CYCLES
from shared.retention import (
    KEPT_SUBJECTS,
    PRUNE_INBOX,
    PRUNE_OUTBOX,
    ROUNDS,
    Kept,
    Pruned,
    Pruner,
    Retention,
    prune,
)
from tests.support.cluster import eventually

DAY = 24 * 3600


async def events(
    db: asyncpg.Connection, n: int, subject: str, published_days_ago: float | None
) -> None:
    """`n` outbox rows of `subject`, published that many days ago (None: not yet)."""
    await db.execute(
        "INSERT INTO outbox(event_id, subject, payload, created_at, published_at)"
        " SELECT gen_random_uuid(), $2, convert_to('{}', 'UTF8'),"
        " now() - make_interval(days => 30),"
        " CASE WHEN $3::float8 IS NULL THEN NULL"
        " ELSE now() - make_interval(secs => $3::float8 * 86400) END"
        " FROM generate_series(1, $1::int)",
        n,
        subject,
        published_days_ago,
    )


async def applied(db: asyncpg.Connection, n: int, consumer: str, days_ago: float) -> None:
    await db.execute(
        "INSERT INTO inbox(consumer, event_id, applied_at)"
        " SELECT $2, gen_random_uuid(), now() - make_interval(secs => $3::float8 * 86400)"
        " FROM generate_series(1, $1::int)",
        n,
        consumer,
        days_ago,
    )


async def left(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT subject || CASE WHEN published_at IS NULL THEN ' unpublished' ELSE '' END"
        " AS what, count(*) AS n FROM outbox GROUP BY 1"
        " UNION ALL SELECT 'inbox ' || consumer, count(*) FROM inbox GROUP BY consumer"
    )
    return {r["what"]: r["n"] for r in rows}


async def test_old_published_events_and_old_inbox_rows_go_and_nothing_else(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await events(db, 12_000, "muster.job.started", published_days_ago=8)  # three batches
    await events(db, 5, "muster.job.finished", published_days_ago=1)
    await events(db, 3, "muster.job.started", published_days_ago=None)  # created 30 days ago
    await events(db, 4, KEPT_SUBJECTS[0], published_days_ago=90)
    await applied(db, 7_000, "placer", days_ago=9)
    await applied(db, 6, "placer", days_ago=7.5)  # the stream may still redeliver these
    await applied(db, 2, "fairshare", days_ago=0)
    # asked to keep two days of events and an hour of the inbox: the inbox keeps what
    # the stream can still redeliver
    keep = Retention(outbox_keep_s=2 * DAY, inbox_keep_s=3600, batch=5_000)
    pruned = await prune(pool, keep)
    assert pruned == Pruned(outbox=12_000, inbox=7_000, more=False)
    assert await left(db) == {
        "muster.job.finished": 5,
        "muster.job.started unpublished": 3,
        "muster.node.fault": 4,
        "inbox placer": 6,
        "inbox fairshare": 2,
    }
    assert await prune(pool, keep) == Pruned(0, 0)


async def test_two_pruners_at_once_share_the_work(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await events(db, 9_000, "muster.job.started", published_days_ago=8)
    await applied(db, 9_000, "launcher", days_ago=9)
    retention = Retention(batch=1_000)
    both = await asyncio.gather(prune(pool, retention), prune(pool, retention))
    assert sum(p.outbox for p in both) == 9_000
    assert sum(p.inbox for p in both) == 9_000
    assert await left(db) == {}


async def test_rows_another_pruner_holds_are_skipped_not_waited_for(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """The oldest rows of each table locked by another transaction (a pruner mid-batch):
    a pass removes the rest at once instead of waiting on that lock."""
    await events(db, 3_000, "muster.job.started", published_days_ago=8)
    await applied(db, 3_000, "launcher", days_ago=9)
    async with db.transaction():
        await db.execute("SELECT 1 FROM outbox ORDER BY id LIMIT 1000 FOR UPDATE")
        await db.execute("SELECT 1 FROM inbox ORDER BY applied_at LIMIT 1000 FOR UPDATE")
        pruned = await asyncio.wait_for(prune(pool, Retention(batch=500)), 10)
        assert (pruned.outbox, pruned.inbox) == (2_000, 2_000)
    assert await left(db) == {"muster.job.started": 1_000, "inbox launcher": 1_000}


async def test_the_pruner_runs_every_period_until_stopped(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(Pruner(pool, Retention(every_s=0.2)).run(stop))
    try:
        await events(db, 10, "muster.job.started", published_days_ago=8)
        await eventually(lambda: left(db), lambda got: got == {}, timeout=10)
        await events(db, 10, "muster.job.started", published_days_ago=8)  # a later pass
        await eventually(lambda: left(db), lambda got: got == {}, timeout=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_a_pass_reads_the_head_of_an_index_not_the_whole_table(
    db: asyncpg.Connection,
) -> None:
    """40,000 events and inbox rows, a batch of them old enough: each statement reads
    at most its batch, from an index, and removes what it read by key."""
    await events(db, 1_000, "muster.job.started", published_days_ago=8)
    await events(db, 40_000, "muster.job.started", published_days_ago=0)
    await applied(db, 1_000, "placer", days_ago=9)
    await applied(db, 40_000, "placer", days_ago=0)
    await db.execute("ANALYZE outbox, inbox")
    statements = {
        "outbox": (PRUNE_OUTBOX, (7 * DAY, 5_000, list(KEPT_SUBJECTS))),
        "inbox": (PRUNE_INBOX, (8 * DAY, 5_000)),
    }
    for table, (sql, args) in statements.items():
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN ANALYZE {sql}", *args))
        assert "Seq Scan" not in plan, f"{table}:\n{plan}"
        assert "Limit" in plan, f"{table}:\n{plan}"
    assert await left(db) == {"muster.job.started": 40_000, "inbox placer": 40_000}


async def test_a_backlog_past_a_passs_rounds_is_left_for_the_next_pass_and_said(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    per_pass = ROUNDS * 100  # batches of 100
    await events(db, 2 * per_pass + 50, "muster.job.started", published_days_ago=8)
    small = Retention(batch=100)
    assert await prune(pool, small) == Pruned(per_pass, 0, more=True)
    assert await prune(pool, small) == Pruned(per_pass, 0, more=True)
    assert await prune(pool, small) == Pruned(50, 0, more=False)
    assert await left(db) == {}


async def test_a_services_own_record_goes_with_the_events_read_by_key(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """The placer's cycle log (`Pruner.keep`): cycles older than the events kept go, in key
    order, and the statement reads the head of the key, not the whole log."""
    await db.execute(
        "INSERT INTO placer_cycles SELECT 1, i, now() - make_interval(days => 9), 0.01, 1, 1"
        " FROM generate_series(1, 3000) i"
    )
    await db.execute(
        "INSERT INTO placer_cycles SELECT 2, i, now(), 0.01, 1, 1 FROM generate_series(1, 40000) i"
    )
    await db.execute("ANALYZE placer_cycles")
    args = (7 * DAY, 5_000)
    plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN {PRUNE_CYCLES}", *args))
    assert "Seq Scan" not in plan and "Limit" in plan, plan
    assert await prune(pool, Retention(), [Kept(PRUNE_CYCLES)]) == Pruned(0, 0, own=3_000)
    assert await db.fetchval("SELECT count(*) FROM placer_cycles") == 40_000
    assert await db.fetchval("SELECT min(epoch) FROM placer_cycles") == 2
