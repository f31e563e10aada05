"""`shared.waits.woken`: a loop's pause ends when it is woken or stopped, whichever
comes first, and says whether it timed out."""

from __future__ import annotations

import asyncio

import pytest

from shared.waits import woken

CASES = {
    "woken during the wait": ("wake", True),
    "stopped during the wait": ("stop", True),
    "neither: the period passes": ("", False),
}


@pytest.mark.parametrize("which,expected", CASES.values(), ids=CASES.keys())
async def test_woken(which: str, expected: bool) -> None:
    events = {"wake": asyncio.Event(), "stop": asyncio.Event()}
    if which:
        asyncio.get_running_loop().call_later(0.05, events[which].set)
    timeout_s = 30.0 if which else 0.05
    result = await asyncio.wait_for(woken(events["wake"], events["stop"], timeout_s), 10)
    assert result is expected
    assert not events["wake"].is_set() or which == "wake"  # never cleared, never set by it


async def test_an_event_already_set_returns_at_once() -> None:
    stop = asyncio.Event()
    stop.set()
    assert await asyncio.wait_for(woken(asyncio.Event(), stop, 3600), 1) is True
