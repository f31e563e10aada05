"""Shell: a node's `status` answer shared by every wait that asks for it.

A coordinator asks each node a step waits on for its `status` every `steps.PROBE_S`,
and a start that waits on a slow prolog does so too (gang.py). A node that runs many
steps at once (a job script's `srun ... &` in a loop) was asked once per step. Here a
wait asks for a status sent no earlier than a moment it names: it joins the request
in flight, or takes its answer, when that request was sent at or after that moment,
and sends a new one otherwise. A request that failed is not shared after it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from shared.api import AgentReply


class StatusProbe:
    def __init__(
        self,
        ask: Callable[[str], Awaitable[AgentReply]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._clock = clock
        self._last: dict[str, tuple[float, asyncio.Future[AgentReply]]] = {}

    async def status(self, node: str, since: float) -> AgentReply:
        """`node`'s status from a request sent at or after `since` (on `clock`)."""
        held = self._last.get(node)
        if held is None or held[0] < since or _failed(held[1]):
            sent = self._clock()  # no later than the request goes: never taken as newer
            asked = asyncio.ensure_future(self._ask(node))
            asked.add_done_callback(_retrieve)
            held = (sent, asked)
            self._last[node] = held
        return await asyncio.shield(held[1])  # a waiter let go leaves it to the others


def _failed(asked: asyncio.Future[AgentReply]) -> bool:
    return asked.done() and (asked.cancelled() or asked.exception() is not None)


def _retrieve(asked: asyncio.Future[AgentReply]) -> None:
    """Its error is its waiters'; with none left it is not logged as never retrieved."""
    with contextlib.suppress(asyncio.CancelledError):
        asked.exception()
