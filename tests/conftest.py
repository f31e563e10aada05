"""Fixtures: real NATS and PostgreSQL servers as child processes on free ports.

PostgreSQL is started once per session (or named by MUSTER_TEST_DATABASE_URL, a server
URL without a database); each test gets a fresh database cloned from a migrated
template. NATS is cheap to start, so each test gets its own server and so fresh
streams (or MUSTER_TEST_NATS_URL names a running one, whose streams are then reset).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import asyncpg
import pytest

from shared import embedded
from shared.db import migrate

# A runner that starts the tests in the background of a non-interactive shell (`cmd &`)
# hands them SIGINT ignored, and every process a test starts would inherit that: the
# tests of what Ctrl-C does (a command interrupted, srun's steps) need it live. A handler
# of our own is not inherited across exec: the children start with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _environment() -> Iterator[None]:
    """What a test put in os.environ (a cluster's FAST timings, its keys folder and
    identity file, a bus URL) ends with it. Left there, the next test signed with keys
    from a folder about to be pruned and read another test's cluster configuration:
    whether it passed depended on which test ran before it."""
    saved = dict(os.environ)
    yield
    for key in os.environ.keys() - saved.keys():
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    url = os.environ.get("MUSTER_TEST_DATABASE_URL")
    if url:
        yield url.rstrip("/")
        return
    # Not under pytest's own temporary root: PostgreSQL runs as its own system user when
    # we are root, and every pytest session that starts (another run on this machine)
    # resets that root to mode 0700 and prunes old sessions' folders under it.
    folder = Path(tempfile.mkdtemp(prefix="muster-test-pg-"))
    server = embedded.start_postgres(folder, fast=True)
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> str:
    name = f"muster_template_{uuid.uuid4().hex[:8]}"
    url = embedded.create_database(pg_server, name)

    async def prepare() -> None:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(prepare())
    return name


@pytest.fixture
def database_url(pg_server: str, template_db: str) -> str:
    return embedded.create_database(pg_server, f"t_{uuid.uuid4().hex[:12]}", template=template_db)


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    url = os.environ.get("MUSTER_TEST_NATS_URL")
    if url:
        asyncio.run(_reset_streams(url))
        yield url
        return
    server = embedded.start_nats(tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


async def _reset_streams(url: str) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    for name in ("MUSTER", "MUSTER_DLQ"):
        with contextlib.suppress(Exception):  # not there yet
            await js.delete_stream(name)
    await nc.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(database_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran a cluster shows the tail of each process's log, so a
    failure on CI's machine can be understood from its output alone."""
    report = yield
    if report.failed and call.when == "call":
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            for log in sorted(tmp.rglob("logs/*.log"))[:12]:
                lines = log.read_text(errors="replace").splitlines()[-25:]
                report.sections.append((f"log {log.name}", "\n".join(lines)))
    return report
