"""Two waits asyncio's own get wrong.

`woken`: a background loop's pause between passes, until it is woken, stopped, or its
period has passed, whichever comes first. `asyncio.wait_for(wake.wait(),
timeout=period)` alone does not see `stop`: a service told to stop then sat out the
rest of the period (fairshare's 5 s priority period held every test cluster's teardown
for 5 s).

`cancel_and_wait`: a task cancelled is gone before its canceller goes on. Python 3.11's
`wait_for` loses a cancel that arrives as its inner future completes (nats.py's connect
has one, and a refused connect completes at once); the task then runs on, retrying its
connect for ever, and `asyncio.wait_for` itself, cancelled a second time while it waits
for its inner task to end, leaves that task behind.
"""

from __future__ import annotations

import asyncio
from typing import Any


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
