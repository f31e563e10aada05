"""Service test: the three-server JetStream cluster `muster up --nats-servers 3` runs
(real nats-servers): the streams are kept on all three, every write is fsynced before
it is acknowledged, and losing one server, the stream's leader included, loses no
acknowledged event and stops publishing only for a moment."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from nats.js.errors import NoStreamResponseError

from shared import embedded
from shared.bus import STREAM, Bus
from shared.events import NodeDown
from shared.runtime import until_ready
from shared.transient import is_transient


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[embedded.NatsCluster]:
    nats = embedded.start_nats_cluster(tmp_path)
    try:
        yield nats
    finally:
        nats.stop()


def event() -> NodeDown:
    return NodeDown(
        event_id=uuid.uuid4(), occurred_at=datetime.now(UTC), node="node01", reason="test"
    )


async def test_the_streams_are_replicated_to_all_three_servers(
    cluster: embedded.NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.url, name="r3-test", stream_replicas=3)
    try:
        # As a service does: a cluster just formed may answer its first call late.
        await until_ready("create streams", bus.ensure_streams, asyncio.Event())
        info = await bus.js.stream_info(STREAM)
    finally:
        await bus.close()
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    peers = {info.cluster.leader, *(r.name for r in info.cluster.replicas or [])}
    assert peers == {"muster-0", "muster-1", "muster-2"}
    assert all("sync_interval: always" in c.read_text() for c in cluster.configs)


async def test_killing_the_stream_leader_loses_no_acknowledged_event(
    cluster: embedded.NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.url, name="r3-kill", stream_replicas=3)
    try:
        # As a service does: a cluster just formed may answer its first call late.
        await until_ready("create streams", bus.ensure_streams, asyncio.Event())
        sent = [event() for _ in range(20)]
        for e in sent[:10]:  # a new stream may still be electing its leader
            await _publish_through_failover(bus, e)
        info = await bus.js.stream_info(STREAM)
        assert info.cluster is not None
        leader = int(str(info.cluster.leader).rsplit("-", 1)[1])
        cluster.servers[leader].kill()  # SIGKILL, as a crash would
        for e in sent[10:]:
            await _publish_through_failover(bus, e)
        after = await bus.js.stream_info(STREAM)
        assert after.state.messages == 20
        assert after.cluster is not None and after.cluster.leader != info.cluster.leader
        cluster.restart(leader)  # it rejoins; the stream keeps its three copies
        again = await bus.js.stream_info(STREAM)
        assert again.state.messages == 20
    finally:
        await bus.close()


async def _publish_through_failover(bus: Bus, e: NodeDown) -> None:
    """Publish as a relay does: a publish that fails while the stream elects a leader
    is tried again with the same Nats-Msg-Id, so it is stored once."""
    for _ in range(50):
        try:
            await bus.publish(e)
            return
        except Exception as err:  # the relay's retry; the event id keeps it to one copy
            # No stream response: the stream has no leader at this moment.
            if not (is_transient(err) or isinstance(err, NoStreamResponseError)):
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("publishing did not resume after one server of three died")
