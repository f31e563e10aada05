"""`srun --pty` tasks under their stepds (services/launcher/pty_task.py), relayed by the
agent's step runner (steps_pty.py), on a real NATS server with a real zygote, stepds,
ptys and tasks: what the task prints reaches `<subject>.out`, what is published on `.in`
is typed into it, a message carrying srun's window size (shared/pty_size.py) is set on
the pty instead (a malformed one is ignored), and the pty starts at the size the launch
gave. An agent that dies mid-step leaves the terminal with its stepd; the next agent's
runner relays it again, the output printed meanwhile first, and the keys typed meanwhile
(srun asks until a relay answers, muster/pty_keys.py); and it answers the launcher's
`adopt` with the task's own exit, including for a task that ended while no agent ran."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from muster.pty_keys import ANSWER_S, KeySender
from services.launcher.steps_agent import StepRunner
from services.launcher.worker_table import (
    StepStarted,
    alive,
    read_struct,
)
from shared import pty_size
from shared.api import StepLaunch, StepOutcome, StepTaskSpec
from shared.bus import Bus
from tests.support.step_runner import SIGNER, Executor

TASK = (
    "stty size; echo ready; read a; echo got-$a; read b; stty size;"
    " until [ -e {go} ]; do sleep 0.05; done; echo away-$((40 + 2)); {then}"
)


@pytest.fixture
async def executor(tmp_path: Path, bus: Bus) -> AsyncIterator[Executor]:
    ex = Executor(tmp_path / "state", bus)
    try:
        yield ex
    finally:
        await asyncio.to_thread(ex.zygote.close)


class Screen:
    """srun's side: what arrived on `.out`, and keys (or a size) sent on `.in`."""

    def __init__(self, client: Client, subject: str) -> None:
        self.client = client
        self.subject = subject
        self.keys = KeySender(client, subject + ".in")  # as srun sends them
        self.shown = bytearray()
        self.seen = asyncio.Event()

    async def listen(self) -> None:
        async def out(msg: Any) -> None:
            self.shown.extend(msg.data)
            self.seen.set()

        await self.client.subscribe(self.subject + ".out", cb=out)
        await self.client.flush()

    async def printed(self, text: bytes, within_s: float = 15.0) -> None:
        deadline = time.monotonic() + within_s
        while text not in self.shown:
            left = deadline - time.monotonic()
            assert left > 0, f"no {text!r} on the terminal: {bytes(self.shown)!r}"
            self.seen.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.seen.wait(), left)

    async def type(self, keys: bytes) -> None:
        """As srun types: returns once a relay has them (asked again while none listens)."""
        await self.keys.send(keys)

    async def resize(self, window: str) -> None:
        header = {pty_size.WINDOW_HEADER: window}
        await self.client.publish(self.subject + ".in", b"", headers=header)

    def sizes(self) -> list[bytes]:
        lines = bytes(self.shown).replace(b"\r", b"").split(b"\n")
        return [line for line in lines if line[:1].isdigit()]


def launch(tmp_path: Path, subject: str, script: str, *, adopt: bool = False) -> StepLaunch:
    task = StepTaskSpec(
        procid=0, env=dict(os.environ), stdout=str(tmp_path / "o" / "0.out"),
        stderr=str(tmp_path / "o" / "0.err"),
    )  # fmt: skip
    body = StepLaunch(
        job_id=1, attempt=0, generation=0, step_id=2, argv=("sh", "-c", script),
        tasks=(task,), workdir=str(tmp_path), pty=subject, pty_window="30 90", adopt=adopt,
    )  # fmt: skip
    return SIGNER.sign(body, "n0", now=time.time())


@pytest.fixture
async def screen(nats_url: str) -> AsyncIterator[Screen]:
    client = await nats.connect(nats_url)
    seen = Screen(client, f"muster.pty.test.{os.urandom(16).hex()}")
    await seen.listen()
    try:
        yield seen
    finally:
        await client.close()


async def started(state: Path) -> StepStarted:
    deadline = time.monotonic() + 30
    while True:
        for folder in sorted((state / "steps").glob("*")):
            got = read_struct(folder / "started.json", StepStarted)
            if got is not None:
                return got
        assert time.monotonic() < deadline, "the terminal task never started"
        await asyncio.sleep(0.05)


async def agent_dies(waiting: asyncio.Task[StepOutcome]) -> None:
    """The runner's wait and relay cut short, as an agent killed (its socket closes)."""
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting


async def test_a_terminal_outlives_its_agent_and_the_next_one_relays_it(
    executor: Executor, screen: Screen, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = TASK.format(go=go, then="read c; stty size; echo got-$c; exit 3")
    step = launch(tmp_path, screen.subject, script)
    first = StepRunner(executor)
    waiting = asyncio.create_task(first.outcome_of(step))
    await screen.printed(b"ready")
    await screen.type(b"x\r")
    await screen.printed(b"got-x")
    await screen.resize(pty_size.encode(40, 120))
    await screen.type(b"\r")
    await screen.printed(b"40 120")
    task = await started(executor.table.state)

    await agent_dies(waiting)
    assert alive(task.worker), "the terminal's task outlives its agent"
    go.write_text("x")  # it prints while no agent relays it
    await asyncio.sleep(0.5)
    await screen.resize("0 99999")  # published, nobody relays it: lost, harmlessly
    typing = asyncio.create_task(screen.type(b"y\r"))  # typed while no agent runs
    await asyncio.sleep(0.5)
    assert not typing.done(), "no relay has the keys: srun asks again"
    again = StepRunner(executor)  # the next agent
    again.resume()
    asked = asyncio.create_task(again.outcome_of(launch(tmp_path, screen.subject, "", adopt=True)))
    await screen.printed(b"away-42")  # kept by stepd, relayed by the next agent
    await asyncio.wait_for(typing, 15)
    assert screen.keys.answers, "the relay answers each message of keys"
    await screen.resize("0 99999")  # malformed: ignored
    await screen.printed(b"got-y")  # the keys typed while no agent ran
    outcome = await asyncio.wait_for(asked, 30)
    assert (outcome.ok, outcome.exit_codes) == (True, (3,)), outcome
    assert screen.sizes()[:3] == [b"30 90", b"40 120", b"40 120"]
    assert not list((executor.table.state / "steps").glob("*")), "its folder goes"


async def test_a_terminal_task_that_ended_while_no_agent_ran_gives_the_next_its_last_output(
    executor: Executor, screen: Screen, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    script = TASK.format(go=go, then="exit 7")
    first = StepRunner(executor)
    waiting = asyncio.create_task(first.outcome_of(launch(tmp_path, screen.subject, script)))
    await screen.printed(b"ready")
    await screen.type(b"x\r\r")
    await screen.printed(b"got-x")
    task = await started(executor.table.state)
    await agent_dies(waiting)
    go.write_text("x")
    deadline = time.monotonic() + 15
    while alive(task.worker):
        assert time.monotonic() < deadline, "the task never ended"
        await asyncio.sleep(0.05)
    assert alive(task.stepd), "its stepd waits for an agent to take the last output"
    again = StepRunner(executor)
    again.resume()
    adopt = launch(tmp_path, screen.subject, "", adopt=True)
    outcome = await asyncio.wait_for(again.outcome_of(adopt), 30)
    assert (outcome.ok, outcome.exit_codes) == (True, (7,)), outcome
    await screen.printed(b"away-42")
    assert not alive(task.stepd)


async def test_keys_to_a_relay_that_never_answers_go_once_then_are_only_published(
    nats_url: str,
) -> None:
    """An agent from before answers existed hears the keys and never answers: srun
    sends them once (not again on the silence), then publishes as it used to."""
    client = await nats.connect(nats_url)
    try:
        subject = f"muster.pty.test.{os.urandom(16).hex()}.in"
        heard: list[bytes] = []
        both = asyncio.Event()

        async def old_relay(msg: Any) -> None:
            heard.append(msg.data)
            if len(heard) == 2:
                both.set()

        await client.subscribe(subject, cb=old_relay)
        keys = KeySender(client, subject)
        await keys.send(b"a")  # after ANSWER_S of silence
        started = time.monotonic()
        await keys.send(b"b")
        assert keys.answers is False and time.monotonic() - started < ANSWER_S
        await asyncio.wait_for(both.wait(), 5)  # delivered to us meanwhile
        assert heard == [b"a", b"b"]
    finally:
        await client.close()
