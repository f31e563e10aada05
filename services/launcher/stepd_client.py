"""Shell: the node agent's side of one stepd (services/launcher/stepd.py, one per worker):
start it in a session of its own, wait for its first word (started, or ended), kill it.

An interpreter takes a tenth of a second of CPU to start and import stepd, on the path
of every start and every fault restart, and beside it when started ahead (two spares
were kept so until round 5 of issue 20: back to back, each start's spare import still
doubled the next start's latency on a 2-core node). So the agent keeps one `Zygote`:
`stepd_zygote`, its imports done, hands a stepd (forked ahead) to each worker folder it
is sent and answers with its pid. A zygote whose agent is gone reads the
end of its pipe and exits; the stepds it forked run on. Without a working zygote a
start falls back to a cold `start_stepd`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal
import subprocess
import sys
from pathlib import Path

from services.launcher.executor import LaunchError
from services.launcher.stepd import STOPS
from services.launcher.worker_table import (
    ProcessRef,
    StepExit,
    StepStarted,
    alive,
    read_struct,
)

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
# A start waits on these looks (two small reads each): often for its first quarter
# second, when most starts are answered, then at the slower pace (a prolog, a cold start).
_POLL_S, _POLL_FAST_S, _FAST_FOR_S = 0.01, 0.001, 0.25


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


class Stepd:
    """One started stepd: our child (`proc`, a cold start) or the zygote's (`ref`)."""

    def __init__(
        self, pid: int, *, proc: subprocess.Popen[bytes] | None = None,
        ref: ProcessRef | None = None,
    ) -> None:  # fmt: skip
        self.pid = pid
        self.proc = proc
        self.ref = ref

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None  # also reaps it
        return alive(self.ref)

    def stop(self) -> None:
        """SIGTERM to stepd alone (not a prolog it runs): it keeps the stop for its
        worker, and spawns none if it has not yet."""
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, _signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL its session's group (stepd leads it; its worker has a group of its own)."""
        if self.proc is None and not alive(self.ref):
            return  # gone, and its pid may be another process's by now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, _signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=5)


def start_stepd(folder: Path) -> Stepd:
    """A new stepd for `folder`, from a cold start: with SIGTERM and SIGINT blocked, as a
    zygote's spare is, so a stop before its handlers are set is kept (stepd.py)."""
    before = _signal.pthread_sigmask(_signal.SIG_BLOCK, STOPS)
    try:
        return _cold_stepd(folder)
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, before)


def _cold_stepd(folder: Path) -> Stepd:
    with (folder / "stepd.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.launcher.stepd", str(folder)],
            env=_env(),
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,  # its own session: our death or our group's signals
            close_fds=True,  # never reach it
        )
    return Stepd(proc.pid, proc=proc)


class Zygote:
    """`stepd --zygote`, started ahead; `take` has it fork the stepd of one folder."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._answers: asyncio.StreamReader | None = None
        self._lock = asyncio.Lock()  # one fork asked at a time: answers come in order

    def warm(self) -> None:
        """Start the zygote unless one runs (its interpreter starts meanwhile)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._forget()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "services.launcher.stepd_zygote"],
            env=_env(),
            cwd="/",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # each stepd writes to its folder's stepd.log
            start_new_session=True,
            close_fds=True,
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    async def take(self, folder: Path) -> Stepd:
        """A stepd for `folder`, forked by the zygote (a dead one is replaced first; a
        new one answers once its imports are done), else from a cold start when no
        zygote can be started. A zygote that fails once sent the folder is replaced and
        the start fails (LaunchError): it may have forked a stepd for the folder, which
        finds its record gone when the agent gives up the start, and runs nothing."""
        async with self._lock:
            try:
                self.warm()
            except OSError as err:
                log.warning("no stepd zygote, starting stepd cold", extra={"error": repr(err)})
                return start_stepd(folder)
            try:
                return await asyncio.wait_for(self._fork(folder), START_TIMEOUT_S)
            except (OSError, ValueError, EOFError, TimeoutError) as err:
                self._replace()
                raise LaunchError(f"the stepd zygote did not fork a stepd: {err!r}") from err

    async def _fork(self, folder: Path) -> Stepd:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        if self._answers is None:
            reader = asyncio.StreamReader()
            loop = asyncio.get_running_loop()
            await loop.connect_read_pipe(  # its transport closes at the zygote's end
                lambda: asyncio.StreamReaderProtocol(reader), proc.stdout
            )
            self._answers = reader
        proc.stdin.write(f"{folder}\n".encode())
        proc.stdin.flush()
        line = await self._answers.readline()
        if not line:
            raise EOFError("the zygote closed its answers")
        pid, start = (int(x) for x in line.split())
        return Stepd(pid, ref=ProcessRef(pid=pid, start=start) if start else None)

    def _forget(self) -> subprocess.Popen[bytes] | None:
        """Let go of the zygote in hand, its stdin closed (its answers' transport closes
        itself at the zygote's end); it is returned."""
        proc, self._proc, self._answers = self._proc, None, None
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        return proc

    def _replace(self) -> None:
        proc = self._forget()
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, _signal.SIGKILL)  # the zygote's group alone
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.warm()

    def close(self) -> None:
        """The agent stops: the zygote reads the end of its pipe and exits."""
        proc, self._proc, self._answers = self._proc, None, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, _signal.SIGKILL)
            proc.wait(timeout=5)


async def started_or_ended(
    folder: Path, stepd: Stepd, timeout_s: float = START_TIMEOUT_S
) -> StepStarted | StepExit:
    """What stepd said first: the worker runs, or it ended (or never started); a
    LaunchError after `timeout_s` (a site prolog's time included, where there is one)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    deadline = began + timeout_s
    while True:
        # whether it runs, asked before its files are read: a stepd that writes its exit
        # and ends between the two looks is not taken for one that ended without a word
        running = stepd.running()
        started = read_struct(folder / "started.json", StepStarted)
        if started is not None:
            return started
        ending = read_struct(folder / "exit.json", StepExit)
        if ending is not None:
            return ending
        if not running:
            raise LaunchError(f"stepd ended without a word: see {folder}/stepd.log")
        if loop.time() > deadline:
            raise LaunchError(f"stepd did not start the worker in {timeout_s:.0f} s")
        await asyncio.sleep(_POLL_FAST_S if loop.time() - began < _FAST_FOR_S else _POLL_S)
