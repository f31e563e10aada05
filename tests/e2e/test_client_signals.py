"""End to end on a local cluster: salloc and srun told to end (SIGTERM, SIGHUP) let go
of what they hold (muster/ending.py, docs/steps.md), each judged from the database and
from `ps`: no task, command or allocation outlives them.

- salloc still waiting, SIGTERM: the request is given up (the job CANCELLED), exit 143;
- `salloc srun sleep`, SIGTERM: passed on to srun, which ends its step (CANCELLED);
  salloc exits as srun did (143) and the job ends FAILED 143, as Slurm records it;
- `salloc srun --pty sleep`, SIGTERM: the same for a terminal step;
- salloc running its command, SIGHUP (a closed terminal): the command is hung up and
  the allocation let go at once (CANCELLED), exit 129;
- `scancel JOB.STEP` from elsewhere ends that step alone (CANCELLED): srun exits 143,
  and salloc with it.
Before, Python's default ended either client where it stood: the step ran on, and the
allocation was held to its time limit."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.shims import write_shims
from tests.support.cluster import eventually, job_end, nodes, processes, ready, running_cluster

pytestmark = pytest.mark.slow

PY = sys.executable
LAST_STEP = "SELECT state FROM job_steps WHERE job_id = $1 ORDER BY step_id DESC LIMIT 1"


class Client:
    """`muster salloc ARGV` in its own session, its stderr read line by line."""

    def __init__(self, argv: list[str], work: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MUSTER_JOB"))}
        env["PATH"] = f"{work.parent / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # srun's shim
        self.proc = subprocess.Popen(
            [PY, "-m", "muster.cli", "salloc", "-N1", "--gpus-per-node=1", "-t", "5", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=work,
            env=env,
            start_new_session=True,
        )
        self.said: list[str] = []

    async def expect(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        assert self.proc.stderr is not None
        stderr = self.proc.stderr

        async def line() -> str:
            return await asyncio.to_thread(stderr.readline)

        while True:
            text = await asyncio.wait_for(line(), timeout)
            assert text, f"salloc ended before it said {pattern!r}: {self.said}"
            self.said.append(text)
            if found := re.search(pattern, text):
                return found

    async def told(self, signum: int) -> int:
        """Send `signum`; salloc's exit status."""
        self.proc.send_signal(signum)
        return await asyncio.to_thread(self.proc.wait, 60)

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()


async def ended(db: asyncpg.Connection, job: int) -> tuple[str, int | None]:
    row = await job_end(db, job)
    return row["state"], row["exit_code"]


async def test_salloc_and_srun_told_to_end_let_go_of_what_they_hold(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    write_shims(tmp_path / "bin")  # srun as a Slurm user has it
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(1)):
        os.environ["MUSTER_NATS_URL"] = nats_url

        waiting = Client(["-H", "sleep", "3101"], work)  # held: it waits until told
        try:
            job = int((await waiting.expect(r"Pending job allocation (\d+)")).group(1))
            await waiting.expect(r"queued and waiting for resources")
            assert await waiting.told(signal.SIGTERM) == 143
        finally:
            waiting.close()
        assert await ended(db, job) == ("CANCELLED", None)

        # salloc -I2: not granted within 2 s, the request is given up (exit 1), as Slurm's
        hurried = Client(["-H", "-I2", "sleep", "3105"], work)
        try:
            job = int((await hurried.expect(r"Pending job allocation (\d+)")).group(1))
            await hurried.expect(r"not allocated within 2 s \(--immediate\)")
            assert await asyncio.to_thread(hurried.proc.wait, 60) == 1
        finally:
            hurried.close()
        assert await ended(db, job) == ("CANCELLED", None)

        for marker, step in (("3102", ["srun"]), ("3103", ["srun", "--pty"])):
            client = Client([*step, "sleep", marker], work)
            try:
                job = int((await client.expect(r"Granted job allocation (\d+)")).group(1))
                await eventually(
                    partial(db.fetchval, LAST_STEP, job), lambda s: s == "RUNNING", 60.0, "step"
                )
                # RUNNING is recorded as the launch goes out: the task may exec a moment later
                assert await eventually(
                    partial(asyncio.to_thread, processes, f"sleep {marker}"), bool, 30.0, "task"
                )
                assert await client.told(signal.SIGTERM) == 143, client.said
            finally:
                client.close()
            # (srun --pty asks for the cancel and leaves: the step's end is recorded after)
            last = await eventually(
                partial(db.fetchval, LAST_STEP, job), lambda s: s != "RUNNING", 30.0, "its end"
            )
            assert last == "CANCELLED", step
            assert await ended(db, job) == ("FAILED", 143), step
            assert not processes(f"sleep {marker}"), step

        hung = Client(["sleep", "3104"], work)
        try:
            job = int((await hung.expect(r"Granted job allocation (\d+)")).group(1))
            # salloc says it is granted before it starts its command
            assert await eventually(
                lambda: ready(processes("sleep 3104")), bool, 30.0, "salloc's command"
            )
            assert await hung.told(signal.SIGHUP) == 129
        finally:
            hung.close()
        assert await ended(db, job) == ("CANCELLED", None)
        await eventually(lambda: ready(processes("sleep 3104")), lambda p: not p, 30.0, "hung up")

        # scancel JOB.STEP ends that step alone: srun hears it, salloc exits as srun did
        stepping = Client(["srun", "sleep", "3105"], work)
        try:
            job = int((await stepping.expect(r"Granted job allocation (\d+)")).group(1))
            await eventually(
                partial(db.fetchval, LAST_STEP, job), lambda s: s == "RUNNING", 60.0, "step"
            )
            scancel = await asyncio.to_thread(
                subprocess.run,
                [PY, "-m", "muster.shims", "scancel", f"{job}.0"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert scancel.returncode == 0, scancel.stderr
            assert await asyncio.to_thread(stepping.proc.wait, 60) == 143, stepping.said
        finally:
            stepping.close()
        assert await db.fetchval(LAST_STEP, job) == "CANCELLED"
        assert await ended(db, job) == ("FAILED", 143)
        assert not processes("sleep 3105")
