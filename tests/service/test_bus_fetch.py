"""How the bus adapter pulls (`shared/bus.py: _fetch`) on a real NATS server: a lone event
is handed over alone, on one pull request (a second one, for more than was pending,
lingered until its deadline: 10 ms on every lone event), and what is pending behind a
first message comes with it in one fetch, in order. How long a start takes end to end is
bench/submit_latency.py's figure."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import nats
from nats.aio.msg import Msg

from shared.bus import STREAM, Bus, _fetch
from shared.events import NodeDrainRequested, decode

T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
SUBJECTS = ["muster.node.>"]


def drain(node: str) -> NodeDrainRequested:
    return NodeDrainRequested(
        event_id=uuid.uuid4(), occurred_at=T0, node=node, by="test", reason="test"
    )


def nodes_of(msgs: list[Msg]) -> list[str]:
    events = [decode(m.data) for m in msgs]
    return [e.node for e in events if isinstance(e, NodeDrainRequested)]


async def test_a_lone_event_comes_alone_and_a_backlog_comes_in_one_fetch(bus: Bus) -> None:
    sub = await bus._pull_subscription("fetch", SUBJECTS)
    try:
        await bus.publish(drain("n0"))
        lone = await _fetch(sub, 32)
        assert nodes_of(lone) == ["n0"]
        for i in range(1, 6):
            await bus.publish(drain(f"n{i}"))
        backlog = await _fetch(sub, 32)
        assert nodes_of(backlog) == ["n1", "n2", "n3", "n4", "n5"]
        for msg in lone + backlog:
            await msg.ack()
    finally:
        await sub.unsubscribe()


async def test_a_batch_never_takes_more_than_its_size(bus: Bus) -> None:
    sub = await bus._pull_subscription("fetch-small", SUBJECTS)
    try:
        for i in range(5):
            await bus.publish(drain(f"n{i}"))
        first, second = await _fetch(sub, 3), await _fetch(sub, 3)
        assert (nodes_of(first), nodes_of(second)) == (["n0", "n1", "n2"], ["n3", "n4"])
        for msg in first + second:
            await msg.ack()
    finally:
        await sub.unsubscribe()


async def test_a_lone_event_costs_one_pull_request(bus: Bus, nats_url: str) -> None:
    """The second pull, for more than is pending, is the one that lingered: it is not sent."""
    sub = await bus._pull_subscription("fetch-one", SUBJECTS)
    watcher = await nats.connect(nats_url)
    pulls: list[bytes] = []

    async def seen(msg: Msg) -> None:
        pulls.append(msg.data)

    spy = await watcher.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.fetch-one", cb=seen)
    await watcher.flush()
    try:
        await bus.publish(drain("n0"))
        lone = await _fetch(sub, 32)
        await watcher.flush()
        assert (nodes_of(lone), len(pulls)) == (["n0"], 1)
        await lone[0].ack()
    finally:
        await spy.unsubscribe()
        await watcher.close()
        await sub.unsubscribe()
