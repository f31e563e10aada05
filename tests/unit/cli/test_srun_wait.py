"""`srun --pty`'s wait for its step's end (muster/steps.py: `_ended_in_daemon`): the
answer or the refusal of the request loop comes back to the terminal's event loop, and
an srun that stops waiting (interrupted) leaves at once, its asking thread behind it,
rather than once the step ends. `made()` (the step exists: the terminal goes raw) runs
on the loop, not in the asking thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from muster import steps
from muster.client import ApiRefused
from shared.api import StepReply, StepRequest

REQ = StepRequest(user="alice", job_id=7, argv=("sh",), pty="muster.pty.alice.x")


def nothing() -> None:
    """`made`, for the tests here that do not look at it."""


def test_the_steps_end_comes_back_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = StepReply(step_id=2, state="COMPLETED", exit_code=0)
    monkeypatch.setattr(steps, "_until_ended", lambda req, stop, made, patience: ended)
    assert asyncio.run(steps._ended_in_daemon(REQ, threading.Event(), nothing)) == ended


def test_a_refusal_comes_back_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(
        req: StepRequest,
        stop: threading.Event,
        made: Callable[[StepReply], None],
        patience: float | None,
    ) -> StepReply:
        raise ApiRefused("job 7 belongs to 'bob'", "forbidden", ())

    monkeypatch.setattr(steps, "_until_ended", refused)
    with pytest.raises(ApiRefused, match="belongs to"):
        asyncio.run(steps._ended_in_daemon(REQ, threading.Event(), nothing))


def test_an_srun_that_stops_waiting_leaves_without_the_step_ending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step_ends = threading.Event()

    def running(
        req: StepRequest,
        stop: threading.Event,
        made: Callable[[StepReply], None],
        patience: float | None,
    ) -> StepReply:
        step_ends.wait()  # the step runs for ever, as far as this test goes
        return StepReply(step_id=2, state="COMPLETED", exit_code=0)

    monkeypatch.setattr(steps, "_until_ended", running)

    async def interrupted() -> None:
        await asyncio.wait_for(steps._ended_in_daemon(REQ, threading.Event(), nothing), 0.05)

    try:
        with pytest.raises(TimeoutError):
            asyncio.run(interrupted())  # returned: the loop closed without the thread
    finally:
        step_ends.set()


def test_made_runs_on_the_loop_and_stop_reaches_the_asking_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[str] = []

    def asking(
        req: StepRequest,
        stop: threading.Event,
        made: Callable[[StepReply], None],
        patience: float | None,
    ) -> StepReply:
        made(StepReply(step_id=0, state="RUNNING"))  # an answer came: the step exists
        assert stop.wait(5.0), "the stop never came"
        raise ApiRefused("interrupted", "busy", ())

    monkeypatch.setattr(steps, "_until_ended", asking)

    async def wait() -> None:
        loop = asyncio.get_running_loop()
        made = loop.create_future()

        def on_made() -> None:
            seen.append("loop" if asyncio.get_running_loop() is loop else "elsewhere")
            made.set_result(None)

        stop = threading.Event()
        ending = asyncio.ensure_future(steps._ended_in_daemon(REQ, stop, on_made))
        await asyncio.wait_for(made, 5.0)
        stop.set()
        with pytest.raises(ApiRefused, match="interrupted"):
            await ending

    asyncio.run(wait())
    assert seen == ["loop"]
