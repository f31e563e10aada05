"""`srun --pty`'s wait for its step's end (muster/steps.py: `_ended_in_daemon`): the
answer or the refusal of the request loop comes back to the terminal's event loop, and
an srun that stops waiting (interrupted) leaves at once, its asking thread behind it,
rather than once the step ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from muster import steps
from muster.client import ApiRefused
from shared.api import StepReply, StepRequest

REQ = StepRequest(user="alice", job_id=7, argv=("sh",), pty="muster.pty.alice.x")


def test_the_steps_end_comes_back_to_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    ended = StepReply(step_id=2, state="COMPLETED", exit_code=0)
    monkeypatch.setattr(steps, "_until_ended", lambda req: ended)
    assert asyncio.run(steps._ended_in_daemon(REQ)) == ended


def test_a_refusal_comes_back_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(req: StepRequest) -> StepReply:
        raise ApiRefused("job 7 belongs to 'bob'", "forbidden", ())

    monkeypatch.setattr(steps, "_until_ended", refused)
    with pytest.raises(ApiRefused, match="belongs to"):
        asyncio.run(steps._ended_in_daemon(REQ))


def test_an_srun_that_stops_waiting_leaves_without_the_step_ending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step_ends = threading.Event()

    def running(req: StepRequest) -> StepReply:
        step_ends.wait()  # the step runs for ever, as far as this test goes
        return StepReply(step_id=2, state="COMPLETED", exit_code=0)

    monkeypatch.setattr(steps, "_until_ended", running)

    async def interrupted() -> None:
        await asyncio.wait_for(steps._ended_in_daemon(REQ), 0.05)

    try:
        with pytest.raises(TimeoutError):
            asyncio.run(interrupted())  # returned: the loop closed without the thread
    finally:
        step_ends.set()
