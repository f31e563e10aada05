"""`shared.db.idle_at_most` and `shared.lease.lock(idle_s=...)` on a real PostgreSQL:
a transaction a paused process left open (here: one that simply stops sending
statements) holds its locks only until the limit it set, then the server ends its
session and every lock goes with it. The health service's event handler and
lease-guarded passes, and the placer's cycle, set it, so a replica paused
mid-transaction cannot hold back the others for the pool's default."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from shared import lease
from shared.db import idle_at_most
from tests.support.cluster import eventually

KEY = 4242


async def taken(db: asyncpg.Connection) -> bool:
    """Whether someone else holds the lock now (tried, and let go at once if got)."""
    async with db.transaction():
        got: bool = await db.fetchval("SELECT pg_try_advisory_xact_lock($1)", KEY)
    return not got


async def test_an_idle_transaction_past_its_limit_loses_its_session_and_its_locks(
    database_url: str, db: asyncpg.Connection
) -> None:
    paused = await asyncpg.connect(database_url)
    try:
        txn = paused.transaction()
        await txn.start()
        await idle_at_most(paused, 1.0)
        await paused.execute("SELECT pg_advisory_xact_lock($1)", KEY)
        await asyncio.sleep(0.3)
        assert await taken(db), "held while its owner is within the limit"
        await eventually(lambda: taken(db), lambda held: not held, 10.0, "the lock let go")
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, ConnectionError)):
            await paused.execute("SELECT 1")  # its session was ended by the server
    finally:
        paused.terminate()


async def test_a_lease_locked_with_an_idle_limit_is_let_go_within_it(
    database_url: str, db: asyncpg.Connection
) -> None:
    """`lease.lock(..., idle_s)` sets the limit in the statement that takes the lease row
    (the placer's cycle, the health pass): the holder paused right after it keeps the
    row, and so every takeover, only that long. A wrong epoch takes nothing."""
    holder = await lease.acquire(db, "health_lease", "h-0", 60.0)
    assert holder is not None
    paused = await asyncpg.connect(database_url)
    try:
        async with paused.transaction():
            assert not await lease.lock(paused, "health_lease", "h-0", holder + 1, idle_s=1.0)
        txn = paused.transaction()
        await txn.start()
        assert await lease.lock(paused, "health_lease", "h-0", holder, idle_s=1.0)
        assert await paused.fetchval("SHOW idle_in_transaction_session_timeout") == "1s"
        with pytest.raises(asyncpg.LockNotAvailableError):
            async with db.transaction():
                await db.execute("SELECT 1 FROM health_lease WHERE id = 1 FOR UPDATE NOWAIT")
        await asyncio.sleep(1.5)  # paused past its limit: the server ends it
        async with db.transaction():
            await db.execute("SELECT 1 FROM health_lease WHERE id = 1 FOR UPDATE NOWAIT")
    finally:
        paused.terminate()
