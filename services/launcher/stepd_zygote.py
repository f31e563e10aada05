"""Shell: the stepd zygote (`python -m services.launcher.stepd_zygote`), started once by
the node agent (stepd_client.Zygote): its imports done, it hands one stepd to each
worker folder named on its stdin (a line each) and answers each with that stepd's pid
and start tick on stdout.

The stepd it hands over is a **spare**, forked ahead and waiting: in a session of its
own, its event loop built, reading its own pipe for a folder. A fork of this
interpreter costs 1-2 ms on a 2-core VM (the page tables) and the child's first
steps as much again, so a start that had to wait for the fork waited 3-5 ms more
(issue 20, round 8). Once a spare is handed over, the next one is forked when no
request came for `REFILL_S`, so the fork does not compete with the start it follows;
a request with no spare ready forks one then (back to back starts: as before).

A spare whose zygote ended (the agent stopped or died) reads the end of its pipe and
exits without running anything; a spare that died is found by its pipe (EPIPE) and
replaced. The stepds it handed over run on, each in a session of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import select
import signal as _signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import msgspec
import uvloop

from services.launcher import cgroups
from services.launcher.stepd import LOG_FORMAT, STOPS, run_folder
from services.launcher.worker_table import StepExit, StepSpec, StepStarted, process_ref

REFILL_S = 0.05  # quiet this long after a hand-over: the next spare is forked
_STDIN = 0

Hierarchy = Callable[[], cgroups.Hierarchy | None]


class Spare(msgspec.Struct, frozen=True):
    """A forked stepd waiting for its folder on `fd` (our end of its pipe)."""

    pid: int
    start: int  # its start tick (0: gone already)
    fd: int


def serve() -> None:
    """The zygote's loop, until its stdin ends."""
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # the kernel reaps the stepds
    detected = cgroups.detect()
    _warm()
    spare: Spare | None = _fork_spare(lambda: detected)
    pending = b""
    while True:
        if b"\n" not in pending:
            if spare is None and not _readable(_STDIN, REFILL_S):
                spare = _fork_spare(lambda: detected)
                continue
            chunk = os.read(_STDIN, 65536)
            if not chunk:
                break  # the agent's end of the pipe: done
            pending += chunk
            continue
        line, pending = pending.split(b"\n", 1)
        folder = line.decode().strip()
        if not folder:
            continue
        spare, handed = None, _hand_over(spare, folder, lambda: detected)
        sys.stdout.write(f"{handed.pid} {handed.start}\n")
        sys.stdout.flush()
    if spare is not None:
        os.close(spare.fd)  # it reads the end and exits


def _warm() -> None:
    """What every stepd would otherwise do again after its fork (2 ms of a 14 ms
    start): its logging set up, a loop's first run, msgspec's compiled view of its
    records. Then the heap is frozen: no collection in a child copies it page by page."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as warm:
        warm.run(asyncio.sleep(0))
    for kind in (StepSpec, StepStarted, StepExit):
        with contextlib.suppress(msgspec.ValidationError):
            msgspec.json.decode(b"{}", type=kind)
    gc.freeze()


def _readable(fd: int, timeout_s: float) -> bool:
    ready, _, _ = select.select([fd], [], [], timeout_s)
    return bool(ready)


def _hand_over(spare: Spare | None, folder: str, hierarchy: Hierarchy) -> Spare:
    """`folder` given to `spare`, or to a fresh one if it is missing or dead."""
    for _ in range(2):
        if spare is None:
            spare = _fork_spare(hierarchy)
        try:
            os.write(spare.fd, f"{folder}\n".encode())
        except BrokenPipeError:  # the spare died: its pipe has no reader
            os.close(spare.fd)
            spare = None
            continue
        os.close(spare.fd)
        return spare
    raise OSError(f"no stepd could be forked for {folder}")


def _fork_spare(hierarchy: Hierarchy) -> Spare:
    """A spare, born with SIGTERM and SIGINT blocked: a stop sent the moment its pid is
    known (the agent's stop of the start it was handed) waits, pending, until stepd's
    handlers are set (`stepd._stop_on_signals`), instead of ending it without a word."""
    read_fd, write_fd = os.pipe()
    before = _signal.pthread_sigmask(_signal.SIG_BLOCK, STOPS)
    pid = os.fork()
    if pid == 0:
        os.close(write_fd)
        _wait_as_spare(read_fd, hierarchy)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, before)
    os.close(read_fd)
    ref = process_ref(pid)
    return Spare(pid=pid, start=ref.start if ref is not None else 0, fd=write_fd)


def _wait_as_spare(read_fd: int, hierarchy: Hierarchy) -> NoReturn:
    """The zygote's child: a session of its own, the agent's pipes let go, its loop
    built; then the folder it is given, and the stepd's work. It never returns into
    the zygote's loop."""
    try:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # its worker is waited for
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # not the agent's pipes: its reader sees the zygote's end
            os.dup2(null, fd)
        os.close(null)
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
        runner.get_loop()
        folder = _read_line(read_fd)
        if not folder:
            os._exit(0)  # the zygote ended before it needed this spare
        log_fd = os.open(Path(folder) / "stepd.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    except BaseException:
        os._exit(1)  # no stepd.log to say why; the agent reports it did not start
    run_folder(Path(folder), hierarchy, runner)


def _read_line(fd: int) -> str:
    """One line from `fd`, without its newline ('' at the end of the pipe)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            return ""
        data += chunk
    os.close(fd)
    return data.decode().strip()


if __name__ == "__main__":
    serve()
