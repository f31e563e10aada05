"""Two waits asyncio's own get wrong.

`woken`: a background loop's pause between passes, until it is woken, stopped, or its
period has passed, whichever comes first. `asyncio.wait_for(wake.wait(),
timeout=period)` alone does not see `stop`: a service told to stop then sat out the
rest of the period (fairshare's 5 s priority period held every test cluster's teardown
for 5 s).

`first_where`: the futures still pending once one of them completed with a result that
passes a test (srun -K's first bad task, or node), or None once all completed and none
did; a cancel of the caller leaves the futures as they are.

`cancel_and_wait`: a task cancelled is gone before its canceller goes on. Python 3.11's
`wait_for` loses a cancel that arrives as its inner future completes (nats.py's connect
has one, and a refused connect completes at once); the task then runs on, retrying its
connect for ever, and `asyncio.wait_for` itself, cancelled a second time while it waits
for its inner task to end, leaves that task behind.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any, TypeVar

T = TypeVar("T")


async def woken(wake: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> bool:
    """Wait until `wake` or `stop` is set or `timeout_s` has passed; False on timeout
    alone. Neither event is cleared."""
    if wake.is_set() or stop.is_set():
        return True
    waits = (asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait()))
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return bool(done)


async def cancel_and_wait(task: asyncio.Future[Any], every_s: float = 0.1) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again every `every_s`.
    A cancel of the caller meanwhile is held until `task` has ended and then raised, so
    the task is never left running behind its caller."""
    held = False
    while not task.done():
        task.cancel()
        try:
            await asyncio.wait((task,), timeout=every_s)
        except asyncio.CancelledError:
            held = True
    if held:
        raise asyncio.CancelledError


async def first_where(
    futures: Collection[asyncio.Future[T]], passes: Callable[[T], bool]
) -> set[asyncio.Future[T]] | None:
    """Wait until one of `futures` completes with a result that `passes` (one that
    raised does not): the others, still pending; None when all completed, none passing."""
    pending = set(futures)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if any(passes(f.result()) for f in done if not f.cancelled() and not f.exception()):
            return pending
    return None
