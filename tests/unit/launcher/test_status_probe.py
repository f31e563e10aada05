"""A node's status shared by the waits that ask for it (services/launcher/status_probe.py):
joined while in flight, reused while new enough, asked again when older than the wait
needs or when it failed, per node, and never cancelled by one waiter letting go."""

from __future__ import annotations

import asyncio

import pytest

from services.launcher.status_probe import StatusProbe
from shared.api import AgentReply


class Node:
    """The agents' side: counts the requests, answers each when told to."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.go = asyncio.Event()
        self.fail = False
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    async def ask(self, node: str) -> AgentReply:
        self.asked.append(node)
        await self.go.wait()
        if self.fail:
            raise RuntimeError("not transient")
        return AgentReply(ok=True, message=f"{node}#{len(self.asked)}")


async def test_waits_on_one_node_share_a_request_in_flight_and_its_answer() -> None:
    node = Node()
    probe = StatusProbe(node.ask, node.clock)
    first = asyncio.ensure_future(probe.status("n1", since=99.0))
    second = asyncio.ensure_future(probe.status("n1", since=100.0))
    await asyncio.sleep(0)
    node.go.set()
    assert [(await first).message, (await second).message] == ["n1#1", "n1#1"]
    node.now = 102.0
    assert (await probe.status("n1", since=100.0)).message == "n1#1"  # still new enough
    assert node.asked == ["n1"]


async def test_an_answer_older_than_the_wait_needs_is_asked_again_and_nodes_apart() -> None:
    node = Node()
    node.go.set()
    probe = StatusProbe(node.ask, node.clock)
    assert (await probe.status("n1", since=100.0)).message == "n1#1"
    node.now = 106.0
    assert (await probe.status("n1", since=103.5)).message == "n1#2"
    assert (await probe.status("n2", since=0.0)).message == "n2#3"
    assert node.asked == ["n1", "n1", "n2"]


async def test_a_failed_request_fails_its_waiters_and_is_not_shared_after() -> None:
    node = Node()
    node.fail = True
    node.go.set()
    probe = StatusProbe(node.ask, node.clock)
    with pytest.raises(RuntimeError):
        await probe.status("n1", since=100.0)
    node.fail = False
    assert (await probe.status("n1", since=100.0)).message == "n1#2"


async def test_a_waiter_let_go_leaves_the_request_to_the_others() -> None:
    node = Node()
    probe = StatusProbe(node.ask, node.clock)
    quitter = asyncio.ensure_future(probe.status("n1", since=100.0))
    stayer = asyncio.ensure_future(probe.status("n1", since=100.0))
    await asyncio.sleep(0)
    quitter.cancel()
    await asyncio.sleep(0)
    node.go.set()
    assert (await stayer).message == "n1#1"
    assert quitter.cancelled() and node.asked == ["n1"]
