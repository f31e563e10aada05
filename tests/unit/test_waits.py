"""`shared.waits`: a loop's pause ends when it is woken or stopped, whichever comes
first, and says whether it timed out (`woken`); a task cancelled is gone before its
canceller goes on, even when it loses a cancel (`cancel_and_wait`), and so is a NATS
connect abandoned (`shared.bus._connected`)."""

from __future__ import annotations

import asyncio
from typing import NoReturn

import pytest

from shared.bus import _connected
from shared.waits import cancel_and_wait, first_where, woken

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


async def deaf(lost: int, ran: list[str]) -> NoReturn:
    """A task that loses its first `lost` cancels (as a 3.11 `wait_for` may), then
    would run for ever."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if lost == 0:
                ran.append("ended")
                raise
            lost -= 1


@pytest.mark.parametrize("lost", [0, 1, 3])
async def test_a_cancelled_task_has_ended_even_if_it_lost_cancels(lost: int) -> None:
    ran: list[str] = []
    task = asyncio.ensure_future(deaf(lost, ran))
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, every_s=0.01), 10)
    assert task.cancelled() and ran == ["ended"]


async def test_a_canceller_cancelled_meanwhile_ends_only_after_the_task() -> None:
    ran: list[str] = []
    task = asyncio.ensure_future(deaf(5, ran))
    await asyncio.sleep(0)
    canceller = asyncio.ensure_future(cancel_and_wait(task, every_s=0.05))
    await asyncio.sleep(0.01)
    canceller.cancel()  # as asyncio.wait_for's own cancel of its inner task
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(canceller, 10)
    assert task.done() and ran == ["ended"]  # nothing left running behind it


async def test_an_abandoned_connect_is_ended_not_left_retrying() -> None:
    """The connect that hung a test session's teardown: one cancel lost, it retried for
    ever. Timed out or with its caller cancelled, it has ended first."""
    for how in ("timed out", "caller cancelled"):
        ran: list[str] = []
        connecting = asyncio.ensure_future(deaf(1, ran))
        waiting = asyncio.ensure_future(_connected(connecting, 0.05 if how == "timed out" else 60))
        if how == "caller cancelled":
            await asyncio.sleep(0.01)
            waiting.cancel()
        with pytest.raises(TimeoutError if how == "timed out" else asyncio.CancelledError):
            await asyncio.wait_for(waiting, 10)
        assert connecting.done() and ran == ["ended"], how


async def test_first_where_returns_the_others_once_one_passes_and_none_when_none_does() -> None:
    loop = asyncio.get_running_loop()
    good, bad, slow = (loop.create_future() for _ in range(3))
    waiting = asyncio.ensure_future(first_where([good, bad, slow], lambda v: v != 0))
    good.set_result(0)
    await asyncio.sleep(0)
    assert not waiting.done(), "a result that does not pass: still waiting"
    bad.set_result(3)
    assert await waiting == {slow}
    failed: asyncio.Future[int] = loop.create_future()
    failed.set_exception(OSError("gone"))  # one that raised does not pass
    done_well: asyncio.Future[int] = loop.create_future()
    done_well.set_result(0)
    assert await first_where([failed, done_well], lambda v: v != 0) is None
    slow.cancel()
