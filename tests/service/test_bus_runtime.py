"""The lifecycle plumbing under outages (`shared/runtime.py`, `shared/db.py`): a loop
that fails is restarted instead of ending the service, one that ignores `stop` is
cancelled after the grace time, every query carries its timeouts, and the pool
reconnects by itself after PostgreSQL is killed and restarted on the same port."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from shared import embedded
from shared.bus import FIRST_CONNECT_S
from shared.db import create_pool
from shared.runtime import StoppedBeforeReady, service_context, until_stopped
from shared.settings import Settings
from shared.transient import is_transient


async def test_a_loop_that_loses_its_server_is_restarted_and_the_others_keep_running() -> None:
    stop = asyncio.Event()
    starts = 0
    ticks = 0

    async def flaky(stop: asyncio.Event) -> None:
        nonlocal starts
        starts += 1
        if starts <= 3:
            raise ConnectionRefusedError(111, "PostgreSQL is down")
        stop.set()  # the fourth start runs, and ends the test

    async def steady(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    await asyncio.wait_for(until_stopped(stop, flaky, steady), timeout=30)

    assert starts == 4 and ticks > 0


async def test_a_loop_that_ignores_stop_is_cancelled_after_the_grace_time() -> None:
    stop = asyncio.Event()
    cancelled = asyncio.Event()

    async def stubborn(stop: asyncio.Event) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()

    async def stopper(stop: asyncio.Event) -> None:
        stop.set()

    t0 = time.monotonic()
    await asyncio.wait_for(until_stopped(stop, stubborn, stopper, grace_s=0.2), timeout=30)

    assert cancelled.is_set() and time.monotonic() - t0 < 20


async def test_every_query_carries_the_configured_timeouts(
    database_url: str, db: asyncpg.Connection
) -> None:
    settings = Settings(database_url=database_url, db_lock_timeout_s=0.2)
    pool = await create_pool(settings)
    try:
        async with pool.acquire() as conn:
            shown = [await conn.fetchval(f"SHOW {name}") for name in _TIMEOUTS]
            named = await conn.fetchval("SHOW application_name")
            await db.execute("CREATE TABLE held(id int PRIMARY KEY); INSERT INTO held VALUES (1)")
            async with db.transaction():
                await db.execute("SELECT * FROM held FOR UPDATE")
                with pytest.raises(asyncpg.LockNotAvailableError) as waited:
                    await conn.execute("SELECT * FROM held FOR UPDATE")
    finally:
        await pool.close()

    assert shown == ["30s", "200ms", "10s"]
    assert named == "muster-muster-0"  # the service and its instance, in pg_stat_activity
    assert is_transient(waited.value)


_TIMEOUTS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


@pytest.fixture
def own_dir() -> Iterator[Path]:
    """A folder outside pytest's: a concurrent pytest session resets the permissions of
    its own root, which the PostgreSQL system user must traverse."""
    with tempfile.TemporaryDirectory(prefix="muster-outage-", ignore_cleanup_errors=True) as folder:
        yield Path(folder)


async def test_the_pool_reconnects_after_postgresql_is_killed_and_restarted(
    own_dir: Path,
) -> None:
    state = own_dir / "pg-state"
    server = embedded.start_postgres(state, fast=True)
    port = int(server.url.rsplit(":", 1)[1])
    url = embedded.create_database(server.url, "muster")
    pool = await create_pool(Settings(database_url=url, db_connect_timeout_s=2.0))
    try:
        assert await pool.fetchval("SELECT 1") == 1
        await asyncio.to_thread(server.kill)
        with pytest.raises(Exception) as lost:
            await pool.fetchval("SELECT 1")
        assert is_transient(lost.value)

        server = await asyncio.to_thread(embedded.start_postgres, state, port, fast=True)
        assert await _when_back(pool) == 1
    finally:
        await pool.close()
        server.stop()


async def _when_back(pool: asyncpg.Pool) -> int:
    for _ in range(100):
        try:
            value: int = await pool.fetchval("SELECT 1")
            return value
        except Exception as err:
            if not is_transient(err):
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("the pool never reconnected")


async def test_a_service_started_before_nats_waits_for_it_and_then_runs(
    own_dir: Path, database_url: str
) -> None:
    port = embedded.free_port()
    settings = Settings(nats_url=f"nats://127.0.0.1:{port}", database_url=database_url)
    stop = asyncio.Event()

    async def start() -> bool:
        async with service_context(settings, stop) as ctx:
            seen: bool = await ctx.pool.fetchval("SELECT count(*) > 0 FROM schema_migrations")
            return seen

    starting = asyncio.create_task(start())
    await asyncio.sleep(1.5)
    assert not starting.done()  # still waiting, not failed
    server = await asyncio.to_thread(embedded.start_nats, own_dir / "late-nats", port)
    try:
        assert await asyncio.wait_for(starting, timeout=60) is True
    finally:
        server.stop()


async def test_stop_while_waiting_for_the_servers_ends_the_start_promptly() -> None:
    port = embedded.free_port()
    settings = Settings(nats_url=f"nats://127.0.0.1:{port}")
    stop = asyncio.Event()

    async def start() -> None:
        async with service_context(settings, stop):
            raise AssertionError("no server is up; the context must not be entered")

    starting = asyncio.create_task(start())
    await asyncio.sleep(0.5)
    stop.set()
    # The connect in flight is abandoned too: it alone would last FIRST_CONNECT_S.
    with pytest.raises(StoppedBeforeReady):
        await asyncio.wait_for(starting, timeout=FIRST_CONNECT_S / 2)


async def test_a_service_stopped_while_postgresql_is_down_still_ends_cleanly(
    own_dir: Path, nats_url: str
) -> None:
    server = embedded.start_postgres(own_dir / "pg-state")
    url = embedded.create_database(server.url, "muster")
    settings = Settings(nats_url=nats_url, database_url=url, drain_timeout_s=2.0)
    stop = asyncio.Event()
    try:
        t0 = time.monotonic()
        async with service_context(settings, stop) as ctx, ctx.pool.acquire() as conn:
            await conn.fetchval("SELECT 1")  # a connection in use when the server dies
            await asyncio.to_thread(server.kill)
            t0 = time.monotonic()
            with pytest.raises(Exception) as lost:
                await conn.fetchval("SELECT 1")
    finally:
        server.stop()

    assert is_transient(lost.value)
    assert time.monotonic() - t0 < 20  # the drain timeout, not a hang


async def test_postgresql_with_a_client_still_connected_stops_cleanly(own_dir: Path) -> None:
    """`Server.stop` is PostgreSQL's fast shutdown: on SIGTERM (a smart shutdown) it
    waited for the client below, and was SIGKILLed after the whole timeout."""
    server = embedded.start_postgres(own_dir / "pg-state")
    conn = await asyncpg.connect(server.url + "/postgres")
    try:
        await asyncio.to_thread(server.stop, 5.0)
        assert server.process.returncode == 0  # shut down, not killed (-9)
        assert "database system is shut down" in server.log_path.read_text()
    finally:
        conn.terminate()
        server.kill()
