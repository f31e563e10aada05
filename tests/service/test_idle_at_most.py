"""`shared.db.idle_at_most` on a real PostgreSQL: a transaction a paused process left
open (here: one that simply stops sending statements) holds its locks only until the
limit it set, then the server ends its session and every lock goes with it. The health
service's event handler and lease-guarded passes set it, so a health replica paused
mid-transaction cannot hold back the judging of nodes for the pool's long default."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

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
