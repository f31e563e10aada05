"""A background loop's pause between passes: until it is woken, stopped, or its
period has passed, whichever comes first.

`asyncio.wait_for(wake.wait(), timeout=period)` alone does not see `stop`: a service
told to stop then sat out the rest of the period (fairshare's 5 s priority period
held every test cluster's teardown for 5 s).
"""

from __future__ import annotations

import asyncio


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
