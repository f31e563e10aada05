"""An `srun --pty` task's terminal as its stepd serves it (services/launcher/pty_task.py),
in this process, with a real pty, task and unix socket, and the test as the agent: the
output no agent acknowledged is kept (the newest `BACKLOG` bytes) for the next agent;
an agent that does not keep up stops the terminal's reading (the task blocks, stepd's
memory is bounded) until it acknowledges; a frame too long drops that agent."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.launcher import pty_task
from services.launcher.executor import Worker
from services.launcher.pty_task import ACK, COUNT, KEYS, Terminal, frame, spawn_on_pty

SIZE = 3 * pty_task.BACKLOG  # the task prints this many x's (no newline) at a first key


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Worker, Terminal]]:
    script = f"read go; head -c {SIZE} /dev/zero | tr '\\0' x; read go; exit 4"
    worker, master = spawn_on_pty(("sh", "-c", script), dict(os.environ), str(tmp_path), None, None)
    terminal = Terminal(master, tmp_path / pty_task.SOCKET)
    await terminal.open()
    try:
        yield worker, terminal
    finally:
        await worker.terminate(0.5)
        await terminal.finish(asyncio.Event(), linger_s=0)


async def until(done: object, what: str) -> None:
    for _ in range(200):
        if callable(done) and done():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


async def read_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, want: int) -> int:
    """As the agent: read and acknowledge until `want` bytes came (or the end)."""
    got = 0
    while got < want and (data := await asyncio.wait_for(reader.read(65536), 10)):
        got += len(data)
        writer.write(frame(ACK, COUNT.pack(got)))
    return got


async def test_with_no_agent_the_newest_output_is_kept_and_the_task_never_blocks(
    served: tuple[Worker, Terminal],
) -> None:
    worker, terminal = served
    agent, keys = await asyncio.open_unix_connection(str(terminal.path))
    keys.write(frame(KEYS, b"\r"))
    assert await agent.readexactly(2) == b"\r\n"  # the key's echo
    keys.write(frame(ACK, COUNT.pack(2)))
    keys.close()  # that agent is gone
    await until(lambda: len(terminal.unacked) + terminal.base >= SIZE + 2, "the task printed all")
    assert len(terminal.unacked) == pty_task.BACKLOG
    assert terminal.base == SIZE + 2 - pty_task.BACKLOG
    assert not terminal.paused
    reader, writer = await asyncio.open_unix_connection(str(terminal.path))
    assert await read_all(reader, writer, pty_task.BACKLOG) == pty_task.BACKLOG
    await until(lambda: not terminal.unacked, "the next agent's acknowledgements are taken")
    writer.write(frame(KEYS, b"\r"))
    assert (await worker.wait()).exit_code == 4
    writer.close()


async def test_an_agent_that_does_not_keep_up_blocks_the_terminal_until_it_acknowledges(
    served: tuple[Worker, Terminal],
) -> None:
    worker, terminal = served
    reader, writer = await asyncio.open_unix_connection(str(terminal.path))
    writer.write(frame(KEYS, b"\r"))
    await until(lambda: terminal.paused, "the terminal's reading stops")
    await asyncio.sleep(0.5)
    assert len(terminal.unacked) <= pty_task.BACKLOG + 65536
    assert terminal.base == 0, "nothing dropped: the agent gets every byte"
    assert worker.status is None, "the task waits on its terminal"
    assert await read_all(reader, writer, SIZE + 2) == SIZE + 2  # acknowledged: all of it
    writer.write(frame(KEYS, b"\r"))
    assert (await worker.wait()).exit_code == 4
    writer.close()


async def test_a_frame_too_long_drops_that_agent_and_the_output_waits_for_the_next(
    served: tuple[Worker, Terminal],
) -> None:
    _, terminal = served
    _, writer = await asyncio.open_unix_connection(str(terminal.path))
    writer.write(frame(KEYS, b"\r"))
    writer.write(pty_task.HEADER.pack(KEYS, pty_task.MAX_FRAME + 1))
    await until(lambda: terminal.agent is None, "the agent dropped")
    again, ack = await asyncio.open_unix_connection(str(terminal.path))
    assert await read_all(again, ack, 1) > 0
    writer.close()
    ack.close()
