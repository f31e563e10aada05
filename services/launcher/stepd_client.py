"""Shell: the node agent's side of one stepd (services/launcher/stepd.py, one per worker):
start it in a session of its own, wait for its first word (started, or ended), kill it.

An interpreter takes a few hundred milliseconds to start and import stepd, on the path
of every start and every fault restart. So the agent keeps one stepd ready (`Spare`):
started with `--ready`, its imports done, it waits on a pipe for its worker folder. A
start hands the folder to the spare and starts the next spare at once; a spare whose
agent is gone reads the end of its pipe and exits, having run nothing.
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
_POLL_S, _POLL_FAST_S, _FAST_FOR_S = 0.01, 0.002, 0.25


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
    """One stepd started ahead, waiting for a folder; `take` hands it one."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def warm(self) -> None:
        """Start the next spare unless one waits (its interpreter starts meanwhile)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "services.launcher.stepd", "--ready"],
            env=_env(),
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # it writes to the folder's stepd.log once it has one
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )

    def take(self, folder: Path) -> subprocess.Popen[bytes]:
        """A stepd for `folder`: the spare when one waits, else a cold start; the next
        spare is started either way."""
        proc, self._proc = self._proc, None
        try:
            if proc is None or proc.poll() is not None or proc.stdin is None:
                return start_stepd(folder)
            try:
                proc.stdin.write(f"{folder}\n".encode())
                proc.stdin.close()
            except OSError:  # it died just now
                with contextlib.suppress(OSError):
                    proc.wait(timeout=5)
                return start_stepd(folder)
            return proc
        finally:
            self.warm()

    def close(self) -> None:
        """The agent stops: the spare reads the end of its pipe and exits."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
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
