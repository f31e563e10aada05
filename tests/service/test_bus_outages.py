"""The bus adapter (`shared/bus.py`) on a real NATS server: a transient handler failure
is retried without spending deliveries and is never dead-lettered; poison still is; a
consumer outlives a NATS restart on the same port."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from shared import embedded
from shared.bus import STREAM, Bus, NotMine
from shared.events import AnyEvent, NodeDrainRequested
from shared.transient import is_transient
from tests.support.cluster import eventually

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SUBJECTS = ["muster.node.>"]


def drain(node: str) -> NodeDrainRequested:
    return NodeDrainRequested(
        event_id=uuid.uuid4(), occurred_at=T0, node=node, by="test", reason="test"
    )


class FailingHandler:
    """Fails the first `failures` calls with `error`, then records what it handled."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0
        self.handled: list[AnyEvent] = []
        self.done = asyncio.Event()

    async def __call__(self, event: AnyEvent) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        self.handled.append(event)
        self.done.set()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    # A short ack deadline: a retry that did not extend it would be redelivered.
    bus = await Bus.connect(nats_url, name="bus-test", max_deliver=2, ack_wait_s=1.0)
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.close()


async def _consume_until(bus: Bus, handler: FailingHandler, until: asyncio.Event) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("t", SUBJECTS, handler, stop))
    try:
        await asyncio.wait_for(until.wait(), timeout=60)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def _dead(bus: Bus) -> list[tuple[bytes, dict[str, str]]]:
    return [letter async for letter in bus.dead_letters("t")]


async def test_a_handler_failing_transiently_more_than_max_deliver_times_is_applied_once(
    bus: Bus,
) -> None:
    event = drain("node01")
    handler = FailingHandler(failures=5, error=ConnectionRefusedError(111, "pg is down"))
    await bus.publish(event)

    await _consume_until(bus, handler, handler.done)

    assert handler.handled == [event]
    assert handler.calls == 6  # 5 failures > max_deliver=2, retried in process for 3 s
    assert await _dead(bus) == []
    info = await bus.js.consumer_info(STREAM, "t")
    assert (info.num_redelivered, info.num_ack_pending) == (0, 0)


async def test_a_message_another_replica_owns_is_handed_back_past_max_deliver_and_never_dead(
    bus: Bus,
) -> None:
    # A standby placer asked for spares: not a failure, however often it happens.
    event = drain("node01")
    handler = FailingHandler(failures=3, error=NotMine("spares are granted by the leader"))
    await bus.publish(event)

    await _consume_until(bus, handler, handler.done)

    assert handler.handled == [event]
    assert handler.calls == 4  # 3 hand-backs > max_deliver=2, then applied
    assert await _dead(bus) == []


async def test_a_round_trip_that_timed_out_leaves_the_connection_working(tmp_path: Path) -> None:
    # A paused server answers the PING late: the late PONG must not break the client (in
    # nats.py it met the timed-out flush's cancelled future and killed the read loop).
    server = embedded.start_nats(tmp_path / "n")
    bus = await Bus.connect(server.url, name="rt-test")
    try:
        await bus.round_trip(5)  # nothing of the connect's left in flight
        os.kill(server.process.pid, signal.SIGSTOP)
        await _until_stopped(server.process.pid)  # kill() returns before every thread stops
        with pytest.raises(Exception) as raised:
            await bus.round_trip(1)
        assert is_transient(raised.value)
        os.kill(server.process.pid, signal.SIGCONT)
        await asyncio.sleep(0.5)  # the late PONG arrives
        for _ in range(3):
            await bus.round_trip(2)
        sub = await bus.nc.subscribe("rt.echo")
        await bus.nc.publish("rt.echo", b"x")
        assert (await sub.next_msg(timeout=2)).data == b"x"
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        await bus.close()
        server.stop()


def _state(pid: int) -> str:
    """The process's state letter in /proc, as `ps` shows it (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


async def _until_stopped(pid: int) -> None:
    for _ in range(1000):
        if _state(pid) == "T":
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within 10 s of SIGSTOP")


async def test_a_handler_that_keeps_failing_with_a_bug_is_dead_lettered(bus: Bus) -> None:
    handler = FailingHandler(failures=1_000, error=KeyError("node01"))
    await bus.publish(drain("node01"))
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("t", SUBJECTS, handler, stop))
    try:
        [(_, headers)] = await eventually(lambda: _dead(bus), bool, what="a dead letter")
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)

    assert headers["Muster-Error"] == "failed 2 times: KeyError('node01')"
    assert handler.calls == 2 and handler.handled == []


async def test_a_consumer_outlives_a_nats_restart_and_gets_what_was_published_after(
    tmp_path: Path,
) -> None:
    server = embedded.start_nats(tmp_path / "own-nats")
    port = int(server.url.rsplit(":", 1)[1])
    bus = await Bus.connect(server.url, name="restart-test", max_deliver=2, ack_wait_s=5.0)
    handler = FailingHandler(failures=0, error=RuntimeError("unused"))
    stop = asyncio.Event()
    try:
        await bus.ensure_streams()
        task = asyncio.create_task(bus.consume("t", SUBJECTS, handler, stop))
        await bus.publish(drain("before"))
        await asyncio.wait_for(handler.done.wait(), timeout=30)
        handler.done.clear()

        server.kill()
        await asyncio.sleep(2)
        server = embedded.start_nats(tmp_path / "own-nats", port=port)
        after = drain("after")
        await _publish_when_back(bus, after)

        nodes = await _handled_until(handler, "after")
        # Delivery is at least once (handlers are idempotent by the inbox): the kill may
        # come before the server stored the ack of "before", which then comes again.
        assert (nodes[0], nodes[-1], set(nodes), nodes.count("after")) == (
            "before",
            "after",
            {"before", "after"},
            1,
        )
        assert not task.done()
        stop.set()
        await asyncio.wait_for(task, timeout=30)
    finally:
        await bus.close()
        server.stop()


async def _handled_until(handler: FailingHandler, node: str) -> list[str]:
    """The nodes of the drains handled, once `node`'s is among them."""
    while True:
        await asyncio.wait_for(handler.done.wait(), timeout=60)
        handler.done.clear()
        nodes = [e.node for e in handler.handled if isinstance(e, NodeDrainRequested)]
        if node in nodes:
            return nodes


async def _publish_when_back(bus: Bus, event: NodeDrainRequested) -> None:
    for _ in range(100):
        try:
            await bus.publish(event)
            return
        except Exception:  # the server is still coming back; retry a moment later
            await asyncio.sleep(0.2)
    raise AssertionError("NATS did not come back")


async def test_a_message_in_an_outage_at_shutdown_goes_back_and_the_next_consumer_applies_it(
    bus: Bus,
) -> None:
    event = drain("node01")
    stuck = FailingHandler(failures=1_000_000, error=asyncpg.CannotConnectNowError("starting"))
    await bus.publish(event)
    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("t", SUBJECTS, stuck, stop))
    await eventually(lambda: _value(stuck.calls), lambda n: n >= 3, what="retries")
    stop.set()
    await asyncio.wait_for(task, timeout=30)  # shutdown does not wait for the outage

    healthy = FailingHandler(failures=0, error=RuntimeError("unused"))
    await _consume_until(bus, healthy, healthy.done)

    assert healthy.handled == [event] and stuck.handled == []
    assert await _dead(bus) == []


async def _value(n: int) -> int:
    return n


async def test_a_message_that_kills_its_consumer_every_time_is_dead_lettered_at_last(
    nats_url: str,
) -> None:
    """Deliveries that end with no outcome (the consumer killed mid-handler, modelled
    by a subscriber that never acks) are not failures, until there are ten times the
    poison budget of them."""
    bus = await Bus.connect(nats_url, name="crash-test", max_deliver=1, ack_wait_s=0.3)
    try:
        await bus.ensure_streams()
        crashing = await bus._pull_subscription("t", SUBJECTS)
        await bus.publish(drain("node01"))
        for _ in range(bus.crash_limit):
            [msg] = await crashing.fetch(1, timeout=10)  # then "dies" without an ack
        assert msg.metadata.num_delivered == bus.crash_limit
        await crashing.unsubscribe()

        handler = FailingHandler(failures=0, error=RuntimeError("unused"))
        stop = asyncio.Event()
        task = asyncio.create_task(bus.consume("t", SUBJECTS, handler, stop))
        try:
            [(_, headers)] = await eventually(lambda: _dead(bus), bool, what="a dead letter")
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)
    finally:
        await bus.close()

    assert headers["Muster-Error"] == "delivered 11 times without an outcome"
    assert handler.calls == 0
