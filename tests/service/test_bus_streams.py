"""How the bus adapter makes its streams (`shared/bus.py: ensure_streams`) on a real
NATS server whose streams are not there yet (`nats_url`): a stream left by an older
release with another configuration (create answers 10058, "name already in use") is
updated to this one in place, keeping its events. Any other refusal (10005, no peers)
is an outage to wait out: `tests/unit/test_transient.py`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from nats.js import api

from shared.bus import STREAM, STREAM_SUBJECTS, Bus
from shared.events import NodeDown


async def test_a_stream_with_an_older_configuration_is_updated_and_keeps_its_events(
    nats_url: str,
) -> None:
    bus = await Bus.connect(nats_url, name="streams-test")
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
