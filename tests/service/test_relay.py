"""The outbox relay (`shared/db.py: Relay`) on real PostgreSQL and NATS JetStream: rows
kicked with their commit are published as they are, rows of a plain kick or of no kick
at all by the sweep, and nothing overtakes what was committed before it."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg

from shared.bus import STREAM, Bus
from shared.db import Relay, outbox_add
from shared.events import JobSubmitted, NodeDown, decode
from tests.support.cluster import eventually


def down(node: str) -> NodeDown:
    return NodeDown(event_id=uuid.uuid4(), occurred_at=datetime.now(UTC), node=node, reason="t")


async def published(bus: Bus) -> list[uuid.UUID]:
    """The event ids in the stream, in stream order."""
    info = await bus.js.stream_info(STREAM)
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        msg = await bus.js.get_msg(STREAM, seq)
        assert msg.data is not None
        ids.append(decode(msg.data).event_id)
    return ids


async def unpublished(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"))


@contextlib.asynccontextmanager
async def running(relay: Relay) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield
    finally:
        stop.set()
        relay.kick()
        await asyncio.wait_for(task, 10)


async def test_rows_kicked_with_their_commit_follow_what_a_plain_kick_left_in_order(
    bus: Bus, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    relay = Relay(pool, bus, sweep_s=3600)  # no periodic sweep inside the test
    events = [down(f"node{i:02d}") for i in range(6)]
    async with running(relay):
        await eventually(lambda: published(bus), lambda ids: ids == [], 10)  # first sweep done
        async with pool.acquire() as conn, conn.transaction():
            await outbox_add(conn, *events[:2])
        relay.kick()  # rows not in hand: a sweep publishes them
        for event in events[2:]:  # then one commit after another, each kicked with its rows
            async with pool.acquire() as conn, conn.transaction():
                rows = await outbox_add(conn, event)
            relay.kick(rows)
        ids = await eventually(lambda: published(bus), lambda ids: len(ids) >= 6, 10)
        await eventually(lambda: unpublished(db), lambda n: n == 0, 10)
    assert ids == [e.event_id for e in events]


async def test_rows_committed_without_a_kick_wait_for_the_sweep(
    bus: Bus, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    """A process that died between its commit and its kick: the periodic sweep publishes
    its rows, and one later kicked with its rows does not overtake them."""
    relay = Relay(pool, bus, sweep_s=1.0)
    orphan, later = down("node01"), down("node02")
    async with running(relay):
        await eventually(lambda: published(bus), lambda ids: ids == [], 10)
        async with pool.acquire() as conn, conn.transaction():
            await outbox_add(conn, orphan)  # never kicked
        ids = await eventually(lambda: published(bus), lambda ids: len(ids) == 1, 10)
        async with pool.acquire() as conn, conn.transaction():
            rows = await outbox_add(conn, later)
        relay.kick(rows)
        ids = await eventually(lambda: published(bus), lambda ids: len(ids) == 2, 10)
        await eventually(lambda: unpublished(db), lambda n: n == 0, 10)
    assert ids == [orphan.event_id, later.event_id]


async def test_a_relay_publishes_only_the_subjects_it_owns_even_when_kicked_with_others(
    bus: Bus, pool: asyncpg.Pool, db: asyncpg.Connection
) -> None:
    relay = Relay(pool, bus, sweep_s=3600, subjects=["muster.node.down"])
    ours = down("node01")
    theirs = JobSubmitted(job_id=1, user="alice", account="a", partition="p")
    async with running(relay):
        async with pool.acquire() as conn, conn.transaction():
            rows = await outbox_add(conn, theirs, ours)
        relay.kick(rows)
        ids = await eventually(lambda: published(bus), lambda ids: len(ids) == 1, 10)
        await asyncio.sleep(0.3)  # time enough to publish the other, were it taken
        assert await published(bus) == [ours.event_id]
    assert ids == [ours.event_id]
    left = await db.fetch("SELECT event_id FROM outbox WHERE published_at IS NULL")
    assert [r["event_id"] for r in left] == [theirs.event_id]
