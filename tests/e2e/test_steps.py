"""End to end on a local cluster: job steps and interactive allocations (docs/steps.md).

A batch job on two nodes whose script calls `srun` three times (every node's tasks'
environment asserted: PROCID, LOCALID, STEP_ID, NTASKS, the node, the GPUs bound per
task), the steps listed by `show job`; then `salloc` driven through a pty: it waits for
its allocation, its shell has the job's environment, `srun` from that shell runs on
both nodes, `srun --pty` gives a terminal on the first node, Ctrl-C ends a step, and
when the shell exits the job ends and its GPUs are free again; last, srun outside any
job makes its own allocation, runs its step there and releases it."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.render import show_lines
from muster.shims import write_shims
from services.launcher.worker_table import alive, process_ref
from shared.api import JobSelector, Ok, ShowJobReply, ShowJobRequest
from tests.support.cluster import eventually, nodes, pid_from, ready, running_cluster, submit

pytestmark = pytest.mark.slow

NODES = nodes(2)
PY = sys.executable
LAST_STEP = "SELECT state FROM job_steps WHERE job_id = $1 ORDER BY step_id DESC LIMIT 1"
STEPS = "SELECT count(*) FROM job_steps WHERE job_id = $1"
HOLDING = STEPS + " AND state = 'RUNNING' AND gpus <> '{}'"  # steps holding GPUs
ECHO = (
    'echo "task $SLURM_PROCID $SLURM_LOCALID $SLURM_STEP_ID $SLURM_NTASKS $SLURMD_NODENAME'
    ' G$CUDA_VISIBLE_DEVICES"'
)

BOTH = 'echo "O$SLURM_PROCID"; echo "E$SLURM_PROCID" >&2'


def batch_script(work: Path, keys: Path) -> str:
    # Muster runs the script on every node; the first node drives the steps while the
    # other waits (its worker must run for a step to run there), as an allocation does.
    return f"""#!/bin/bash
export MUSTER_KEY_DIR={keys}  # the launcher passes no MUSTER_ variable of the submitter's
if [ "$SLURM_NODEID" = 0 ]; then
  {PY} -m muster.shims srun -l bash -c '{ECHO}' > {work}/step0.txt
  {PY} -m muster.cli srun -N 1 -n 2 --gpus-per-task=1 bash -c '{ECHO}' > {work}/step1.txt
  {PY} -m muster.cli srun false 2> {work}/step2.err; echo "rc=$?" > {work}/step2.txt
  {PY} -m muster.cli srun -o out-%j.%s-%t-%N.txt -e err-%t.txt bash -c '{BOTH}' > {work}/step3.txt
  {PY} -m muster.cli srun -l --output=all.txt bash -c '{BOTH}' > {work}/step4.txt
  touch {work}/done
else
  while [ ! -f {work}/done ]; do sleep 0.2; done
fi
"""


async def live_gpus(db: asyncpg.Connection, job_id: int) -> int:
    n: int = await db.fetchval(
        "SELECT count(*) FROM allocation_gpus g JOIN allocations a USING (alloc_id)"
        " WHERE a.job_id = $1 AND g.live",
        job_id,
    )
    return n


async def test_steps_in_a_batch_job_and_an_interactive_allocation(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, list(NODES)):
        os.environ["MUSTER_NATS_URL"] = nats_url  # the salloc shell's srun finds the bus
        argv = ("-N", "2", "--gpus-per-node=2", "-t", "5")
        job = (
            await submit(
                nats_url, batch_script(work, tmp_path / "state" / "keys"), argv, workdir=str(work)
            )
        ).job_ids[0]
        await eventually(
            lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job),
            lambda s: s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
            120.0,
            "the batch job's end",
        )
        gpus = await db.fetchval("SELECT gpus::text FROM job_runs WHERE job_id = $1", job)
        held = {k: sorted(v) for k, v in json.loads(gpus).items()}

        step0 = sorted((work / "step0.txt").read_text().splitlines())
        assert step0 == [
            f"0: task 0 0 0 2 node01 G{','.join(map(str, held['node01']))}",
            f"1: task 1 0 0 2 node02 G{','.join(map(str, held['node02']))}",
        ]
        step1 = sorted((work / "step1.txt").read_text().splitlines())
        assert [line.rsplit(" ", 1)[0] for line in step1] == [
            "task 0 0 1 2 node01",
            "task 1 1 1 2 node01",
        ]
        bound = [line.rsplit(" G", 1)[1] for line in step1]  # one GPU each, not the same
        assert len(set(bound)) == 2 and all(int(g) in held["node01"] for g in bound)
        assert (work / "step2.txt").read_text().strip() == "rc=1"
        # srun -o/-e: the tasks' output in the files the patterns name, not srun's own
        assert (work / "step3.txt").read_text() == ""
        for rank, node in enumerate(("node01", "node02")):
            assert (work / f"out-{job}.3-{rank}-{node}.txt").read_text() == f"O{rank}\n"
            assert (work / f"err-{rank}.txt").read_text() == f"E{rank}\n"
        assert (work / "step4.txt").read_text() == ""
        everything = sorted((work / "all.txt").read_text().splitlines())  # -e too, labelled
        assert everything == ["0: E0", "0: O0", "1: E1", "1: O1"]
        assert not (work / ".muster-steps").exists() or not any((work / ".muster-steps").iterdir())

        shown = await call(nats_url, "show", ShowJobRequest(user="root", job_id=job), ShowJobReply)
        steps = [(s.step_id, s.state, s.exit_code, s.ntasks, s.nodes) for s in shown.steps]
        assert steps == [
            (0, "COMPLETED", 0, 2, ("node01", "node02")),
            (1, "COMPLETED", 0, 2, ("node01",)),
            (2, "FAILED", 1, 2, ("node01", "node02")),
            (3, "COMPLETED", 0, 2, ("node01", "node02")),
            (4, "COMPLETED", 0, 2, ("node01", "node02")),
        ]
        assert f"   Step {job}.2: FAILED ExitCode=1 NumTasks=2" in "\n".join(show_lines(shown))
        # sacct lists the steps as JOB.STEP after the job, as Slurm's does; -j JOB.STEP one
        keys = str(tmp_path / "state" / "keys")
        listed = await sacct(keys, "-j", str(job), "-o", "JobID,State,ExitCode")
        ends = ["COMPLETED|0:0", "COMPLETED|0:0", "FAILED|1:0", "COMPLETED|0:0", "COMPLETED|0:0"]
        assert listed == [f"{job}|COMPLETED|0:0", *(f"{job}.{n}|{e}" for n, e in enumerate(ends))]
        assert await sacct(keys, "-j", f"{job}.2", "-o", "JobID,JobName,State") == [
            f"{job}.2|false|FAILED"
        ]

        await interactive(work, db)
        await outside_a_job(work, db)


async def test_a_jobs_gpus_are_freed_only_once_its_step_tasks_are_gone(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """A step task that ignores SIGTERM outlives its job's script until the stop's
    SIGKILL: the job's run ends, and its GPUs go to the next job, only once that task is
    gone (invariant 1). Before, the agent answered the stop as soon as the script was
    gone and ended the step's tasks after, so the next job could start beside them."""
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    pidfile = work / "task.pid"
    task = f'trap "" TERM; echo $$ > {pidfile}; while true; do sleep 0.1; done'
    # srun in a session of its own: the stop's SIGTERM does not reach it, so it does not
    # cancel its step itself (as when the node's fault or a SIGKILL ends the script)
    script = f"""#!/bin/bash
export MUSTER_KEY_DIR={state / "keys"}
setsid {PY} -m muster.cli srun bash -c '{task}' &
echo $! > {work / "srun.pid"}
wait
"""
    # no job cgroup: with one, the script's end kills every process in it, tasks too
    no_cgroup = {"MUSTER_CGROUPS": "off"}
    async with running_cluster(state, nats_url, database_url, db, list(nodes(1)), env=no_cgroup):
        argv = ("--gpus-per-node=1", "-t", "5")
        job = (await submit(nats_url, script, argv, workdir=str(work))).job_ids[0]
        pid = await pid_from(pidfile, 60)
        started = process_ref(pid)
        assert started is not None
        await call(nats_url, "cancel", JobSelector(user="root", job_ids=(job,)), Ok)
        ended = await eventually(
            lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job),
            lambda s: s not in ("RUNNING", "COMPLETING"),
            60.0,
            "the job's end",
        )
        assert ended == "CANCELLED"
        assert not alive(started), "the job ended while its step task still ran"
        srun = process_ref(await pid_from(work / "srun.pid", 5))
        try:  # it hears its step's end (CANCELLED) and leaves
            await eventually(lambda: ready(alive(srun)), lambda up: not up, 60.0, "srun's end")
        finally:
            if srun is not None and alive(srun):
                os.kill(srun.pid, signal.SIGKILL)


async def interactive(work: Path, db: asyncpg.Connection) -> None:
    """salloc through a pty, as a person at a terminal."""
    shims = work.parent / "bin"  # sbatch, srun, salloc, ... as a Slurm user has them
    write_shims(shims)
    master, slave = os.openpty()
    path = f"{shims}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "SHELL": "/bin/sh", "PS1": "$ ", "PATH": path}
    proc = subprocess.Popen(  # noqa: ASYNC220 (a fork+exec; the waits are in threads)
        [str(shims / "salloc"), "-N2", "--gpus-per-node=1", "-t", "5"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=work,
        env=env,
        start_new_session=True,
        preexec_fn=_controlling_tty,  # a terminal's Ctrl-C reaches its foreground job
    )
    os.close(slave)
    term = Terminal(master)
    try:
        granted = await term.expect(r"Granted job allocation (\d+)", 120.0)
        job = int(granted.group(1))
        term.send('echo "J=$SLURM_JOB_ID N=$SLURM_NNODES L=$SLURM_JOB_NODELIST"\n')
        seen = await term.expect(r"J=(\d+) N=(\d) L=(\S+)", 60.0)
        assert seen.groups() == (str(job), "2", "node01,node02")
        term.send(
            "srun bash -c 'echo \"R$SLURM_PROCID@$SLURMD_NODENAME\"' | sort | tr '\\n' ' '; echo\n"
        )
        await term.expect(r"R0@node01 R1@node02", 120.0)
        assert await live_gpus(db, job) == 2
        # srun -w node02 --pty: a terminal on the node named, keys and output via its agent
        # (the prompt is typed in two quoted halves: its echo must not pass for it)
        # (and this terminal's window size, then its change, as SIGWINCH tells srun)
        term.resize(33, 101)
        term.send("PS1='rem''ote> ' srun -w node02 --pty /bin/sh; echo pty_rc=$?\n")
        await term.expect(r"remote> ", 60.0)
        term.send('echo "P=$SLURM_PROCID@$SLURMD_NODENAME:$SLURM_NTASKS"\n')
        await term.expect(r"P=0@node02:1", 60.0)  # the node -w named
        assert await term.remote_size() == "33 101"
        term.resize(44, 132)
        assert await term.remote_size("44 132") == "44 132"
        term.send("exit 4\n")
        await term.expect(r"pty_rc=4", 60.0)
        await busy_terminal(term, job, db)
        # Ctrl-C in srun ends the step's tasks on every node, as Slurm's srun does
        term.send("srun sleep 300; echo rc=$?\n")
        await eventually(
            lambda: db.fetchval(LAST_STEP, job),
            lambda st: st == "RUNNING",
            60.0,
            "the sleep step running",
        )
        term.send("\x03")
        await term.expect(r"rc=130", 60.0)
        ended = await db.fetchrow(LAST_STEP.replace("state", "state, exit_code"), job)
        assert ended is not None
        assert (ended["state"], ended["exit_code"]) == ("CANCELLED", 128 + 15)
        term.send("exit 3\n")
        code = await asyncio.to_thread(proc.wait, 60)
        assert code == 3
        await term.expect(rf"Relinquishing job allocation {job}", 10.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    await eventually(lambda: live_gpus(db, job), lambda n: n == 0, 60.0, "salloc's GPUs freed")
    ended = await eventually(  # as its shell did (exit 3), as Slurm records a salloc job
        lambda: db.fetchrow("SELECT state, exit_code FROM job_runs WHERE job_id = $1", job),
        lambda r: r is not None and r["state"] != "RUNNING",
        60.0,
        "salloc's job ended",
    )
    assert ended is not None
    assert (ended["state"], ended["exit_code"]) == ("FAILED", 3)


async def sacct(keys: str, *words: str) -> list[str]:
    """The sacct shim's records, parsable, no header, as a user's shell runs it."""
    done = await asyncio.to_thread(
        subprocess.run,
        [PY, "-m", "muster.shims", "sacct", "-n", "-P", *words],
        env={**os.environ, "MUSTER_KEY_DIR": keys},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


async def busy_terminal(term: Terminal, job: int, db: asyncpg.Connection) -> None:
    """`srun --pty` whose GPU a running step holds waits with the terminal as it was:
    Ctrl-C ends that srun and no step is made, as Slurm's srun leaves a step it could
    not create. Before, the terminal went raw at once, Ctrl-C went on as a key for a
    step not yet made, and srun waited on."""
    term.send("srun -w node01 --gpus-per-task=1 sleep 300 &\n")
    await eventually(
        lambda: db.fetchval(HOLDING, job), lambda n: n == 1, 60.0, "a step holding the GPU"
    )
    made = await db.fetchval(STEPS, job)
    term.send("squeue -s -h -o '%i|%j|%u|%N'\n")  # the running step, as Slurm's squeue -s
    await term.expect(rf"{job}\.{made - 1}\|sleep\|\w+\|node01", 30.0)
    term.send("srun -w node01 --gpus-per-task=1 --pty /bin/sh; echo busy_rc=$?\n")
    await term.expect(r"step creation temporarily disabled", 60.0)
    term.send("\x03")
    await term.expect(r"busy_rc=130", 30.0)
    assert await db.fetchval(STEPS, job) == made, "a step was made for the interrupted srun"
    term.send("kill $!; wait $!; echo bg_rc=$?\n")  # SIGTERM: srun ends its step, and leaves
    await term.expect(r"bg_rc=143", 60.0)
    await eventually(lambda: db.fetchval(HOLDING, job), lambda n: n == 0, 60.0, "the GPU let go")


async def outside_a_job(work: Path, db: asyncpg.Connection) -> None:
    """srun with no job around it makes one, runs the step on it and releases it, as
    Slurm's srun does: two nodes, labelled output, the step's exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MUSTER_JOB"))}
    task = 'echo "R$SLURM_PROCID@$SLURMD_NODENAME N=$SLURM_NNODES"; exit $((2 + SLURM_PROCID))'
    argv = ["-N2", "--gpus-per-node=1", "-t", "5", "-l", "bash", "-c", task]
    done = await asyncio.to_thread(
        subprocess.run,
        [PY, "-m", "muster.cli", "srun", *argv],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert sorted(done.stdout.splitlines()) == ["0: R0@node01 N=2", "1: R1@node02 N=2"]
    job = int(re.findall(r"srun: job (\d+) has been allocated resources", done.stderr)[0])
    row = await db.fetchrow("SELECT name FROM jobs WHERE job_id = $1", job)
    assert row is not None and row["name"] == "bash"
    await eventually(lambda: live_gpus(db, job), lambda n: n == 0, 60.0, "srun's GPUs freed")
    step = await db.fetchrow(LAST_STEP.replace("state", "state, exit_code"), job)
    assert step is not None and (step["state"], step["exit_code"]) == ("FAILED", 3)
    run = await db.fetchrow("SELECT state, exit_code FROM job_runs WHERE job_id = $1", job)
    assert run is not None and (run["state"], run["exit_code"]) == ("FAILED", 3)  # the step's


def _controlling_tty() -> None:
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """The test's side of a pty: what the session printed so far, and typing into it."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.text = ""

    def send(self, line: str) -> None:
        os.write(self.fd, line.encode())

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal window resized: its foreground job gets SIGWINCH."""
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    async def remote_size(self, want: str = "") -> str:
        """What `stty size` says on the far side; asked again (a few times) until it is
        `want`, since srun forwards a SIGWINCH beside, not before, the keys typed next."""
        for _ in range(20):
            self.send('echo "S=$(stty size)."\n')
            size = (await self.expect(r"S=(\d+ \d+)\.", 30.0)).group(1)
            if not want or size == want:
                break
            await asyncio.sleep(0.2)
        return size

    async def expect(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text)
            if found is not None:
                self.text = self.text[found.end() :]
                return found
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} within {timeout} s; the terminal: {self.text!r}"
                )
            await asyncio.to_thread(self._read, 0.2)

    def _read(self, wait_s: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], wait_s)
        if ready:
            try:
                self.text += os.read(self.fd, 65536).decode(errors="replace")
            except OSError:  # the session closed its end
                time.sleep(wait_s)
