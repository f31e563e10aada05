"""`shared.runtime.until_ready` ends at once when `stop` is set, the attempt in flight
included, even one that loses the first cancel (as nats.py's connect can under Python
3.11's `wait_for`), and keeps a transient error from ending the wait."""

from __future__ import annotations

import asyncio

import pytest

from shared.runtime import StoppedBeforeReady, until_ready


class Attempts:
    """An attempt that never finishes on its own; `swallow` cancels are lost."""

    def __init__(self, swallow: int) -> None:
        self.swallow = swallow
        self.started = asyncio.Event()
        self.ended = False

    async def __call__(self) -> int:
        self.started.set()
        try:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if self.swallow == 0:
                        raise
                    self.swallow -= 1
        finally:
            self.ended = True


@pytest.mark.parametrize("swallow", [0, 1, 3], ids=["a plain attempt", "one lost cancel", "three"])
async def test_stop_ends_an_attempt_in_flight(swallow: int) -> None:
    attempt, stop = Attempts(swallow), asyncio.Event()
    waiting = asyncio.create_task(until_ready("connect", attempt, stop))
    await attempt.started.wait()
    stop.set()
    with pytest.raises(StoppedBeforeReady, match="connect"):
        await asyncio.wait_for(waiting, timeout=30)
    assert attempt.ended and attempt.swallow == 0


async def test_a_transient_error_is_waited_out_and_the_result_returned() -> None:
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionRefusedError(111, "Connection refused")
        return "ready"

    assert await until_ready("connect", attempt, asyncio.Event()) == "ready"
    assert calls == 3


async def test_a_permanent_error_is_raised_at_once() -> None:
    async def attempt() -> None:
        raise ValueError("bad configuration")

    with pytest.raises(ValueError, match="bad configuration"):
        await until_ready("connect", attempt, asyncio.Event())
