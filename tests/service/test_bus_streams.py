"""How the bus adapter makes its streams (`shared/bus.py: ensure_streams`) on a real,
private NATS server: a stream left by an older release with another configuration is
updated to this one in place (create answers 10058, "name already in use"), keeping its
events; any other refusal of the create is raised as it is, never answered with an
update of a stream that may not exist."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js import api

from shared import embedded
from shared.bus import STREAM, STREAM_SUBJECTS, Bus
from shared.events import NodeDown


@pytest.fixture
def server(tmp_path: Path) -> Iterator[embedded.Server]:
    nats = embedded.start_nats(tmp_path)
    try:
        yield nats
    finally:
        nats.stop()


async def test_a_stream_with_an_older_configuration_is_updated_and_keeps_its_events(
    server: embedded.Server,
) -> None:
    bus = await Bus.connect(server.url, name="streams-test")
    try:
        old = api.StreamConfig(
            name=STREAM, subjects=STREAM_SUBJECTS, storage=api.StorageType.FILE, max_age=3600.0
        )
        await bus.js.add_stream(old)
        down = NodeDown(
            event_id=uuid.uuid4(), occurred_at=datetime.now(UTC), node="node01", reason="test"
        )
        await bus.publish(down)
        await bus.ensure_streams()
        await bus.ensure_streams()  # the same configuration again: nothing to change
        info = await bus.js.stream_info(STREAM)
    finally:
        await bus.close()
    assert info.config.max_age == 7 * 24 * 3600.0
    assert info.config.duplicate_window == 120.0
    assert info.state.messages == 1
