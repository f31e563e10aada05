"""Fixtures of the service tests: a bus adapter on the test's own NATS server."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
