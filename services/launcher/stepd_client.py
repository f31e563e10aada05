"""Shell: the node agent's side of one stepd (services/launcher/stepd.py, one per worker):
start it in a session of its own, wait for its first word (started, or ended), kill it."""

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
_POLL_S = 0.01


def start_stepd(folder: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    with (folder / "stepd.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.launcher.stepd", str(folder)],
            env=env,
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own session: our death or our group's signals
            close_fds=True,  # never reach it
        )


async def started_or_ended(folder: Path, proc: subprocess.Popen[bytes]) -> StepStarted | StepExit:
    """What stepd said first: the worker runs, or it ended (or never started)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_TIMEOUT_S
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
        await asyncio.sleep(_POLL_S)


def kill_stepd(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, _signal.SIGKILL)
    proc.wait(timeout=5)
