"""Fixtures of the service tests: a bus adapter on the test's own NATS server, and a
connection pool on the test's own database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from shared.bus import Bus


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    """A connected adapter with the streams made (a test may define its own `bus`)."""
    bus = await Bus.connect(nats_url, name="service-test")
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    assert pool is not None
    try:
        yield pool
    finally:
        await pool.close()
