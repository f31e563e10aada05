"""Shell: the node agent's side of one stepd (services/launcher/stepd.py, one per worker):
start it in a session of its own, wait for its first word (started, or ended), kill it.

An interpreter takes a few hundred milliseconds to start and import stepd, on the path
of every start and every fault restart. So the agent keeps two stepds ready (`Spare`):
started with `--ready`, its imports done, each waits on a pipe for its worker folder. A
start hands the folder to the oldest spare and starts the next one at once; a spare
whose agent is gone reads the end of its pipe and exits, having run nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
import subprocess
import sys
from pathlib import Path

from services.launcher.executor import LaunchError
from services.launcher.worker_table import StepExit, StepStarted, read_struct

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
# A start waits on these looks (two small reads each): often for its first quarter
# second, when most starts are answered, then at the slower pace (a prolog, a cold start).
_POLL_S, _POLL_FAST_S, _FAST_FOR_S = 0.01, 0.001, 0.25


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def start_stepd(folder: Path) -> subprocess.Popen[bytes]:
    """A new stepd for `folder`, from a cold start."""
    with (folder / "stepd.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.launcher.stepd", str(folder)],
            env=_env(),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own session: our death or our group's signals
            close_fds=True,  # never reach it
        )


class Spare:
    """Stepds started ahead, waiting for a folder; `take` hands the oldest one a folder.

    Two wait, not one: a start that comes right after another (a job submitted as the
    last one ended, a gang's restart) found the one spare started by the last start
    still importing, and waited out its tenth of a second or more."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._procs: list[subprocess.Popen[bytes]] = []  # oldest first

    def warm(self) -> None:
        """Start spares until `size` wait (their interpreters start meanwhile)."""
        self._procs = [p for p in self._procs if p.poll() is None]
        while len(self._procs) < self.size:
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "services.launcher.stepd", "--ready"],
                    env=_env(),
                    cwd="/",
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,  # it writes to the folder's stepd.log
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                    close_fds=True,
                )
            )

    def waiting(self) -> list[subprocess.Popen[bytes]]:
        """The spares not handed a folder yet, oldest first."""
        return list(self._procs)

    def take(self, folder: Path) -> subprocess.Popen[bytes]:
        """A stepd for `folder`: the oldest live spare (the likeliest to have finished
        its imports), else a cold start; spares are topped up at once either way. (A
        top-up put off until the start in hand was done landed its imports on the next
        start instead: back to back, p99 195 ms, bench/submit_latency.py.)"""
        try:
            while self._procs:
                proc = self._procs.pop(0)
                if proc.poll() is not None or proc.stdin is None:
                    continue
                try:
                    proc.stdin.write(f"{folder}\n".encode())
                    proc.stdin.close()
                except OSError:  # it died just now
                    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
                    continue
                return proc
            return start_stepd(folder)
        finally:
            self.warm()

    def close(self) -> None:
        """The agent stops: each spare reads the end of its pipe and exits."""
        procs, self._procs = self._procs, []
        for proc in procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_stepd(proc)


async def started_or_ended(folder: Path, proc: subprocess.Popen[bytes]) -> StepStarted | StepExit:
    """What stepd said first: the worker runs, or it ended (or never started)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + START_TIMEOUT_S
    while True:
        started = read_struct(folder / "started.json", StepStarted)
        if started is not None:
            return started
        ending = read_struct(folder / "exit.json", StepExit)
        if ending is not None:
            return ending
        if proc.poll() is not None:
            raise LaunchError(f"stepd exited {proc.returncode}: see {folder}/stepd.log")
        if loop.time() > deadline:
            raise LaunchError(f"stepd did not start the worker in {START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(_POLL_FAST_S if loop.time() - began < _FAST_FOR_S else _POLL_S)


def kill_stepd(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, _signal.SIGKILL)
    proc.wait(timeout=5)
