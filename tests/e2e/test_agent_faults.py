"""End to end, on real NATS, PostgreSQL and processes: a node agent that is killed or
hangs tells the truth. Workers survive a SIGKILLed agent and are re-adopted by the next
one, which reports the exits that happened while it was away; a hung agent's workers
fence themselves before the job runs elsewhere. Every invariant is checked twice: in
the database (job_runs) and on the machine (/proc, the node's worker table)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from services.launcher import steps
from services.launcher.executor import group_members
from services.launcher.worker_table import (
    Ending,
    WorkerRecord,
    WorkerTable,
    alive,
    node_state_folder,
    process_ref,
)
from tests.support.cluster import eventually, kill9, nodes, pid_from, ready, running_cluster, submit

pytestmark = pytest.mark.slow


# Restart within the fence: the agent is back long before the node could be DOWN.
RESTART_ENV = {
    "MUSTER_HEARTBEAT_TIMEOUT_S": "10",
    "MUSTER_DOWN_AFTER_S": "14",
    "MUSTER_FENCE_S": "12",
}
# A hang past DOWN: the fence (3 s) comes well before DOWN (8 s), SUSPECT in between.
HANG_ENV = {
    "MUSTER_HEARTBEAT_TIMEOUT_S": "5",
    "MUSTER_DOWN_AFTER_S": "8",
    "MUSTER_FENCE_S": "3",
}

# Waits for its go file, then exits with the code written in it.
WAITER = """#!/bin/bash
go={dir}/go-{name}
while [ ! -s "$go" ]; do sleep 0.1; done
exit "$(cat "$go")"
"""
# A forking job that ignores SIGTERM: only SIGKILL ends its group.
STUBBORN = """#!/bin/bash
trap '' TERM
sleep 1000 &
while true; do sleep 0.1; done
"""
ONE_GPU = ("--nodes=1", "--gpus-per-node=1")


def table(state: Path, node: str) -> WorkerTable:
    return WorkerTable(node_state_folder(state, node))


def records(state: Path, node: str) -> dict[int, WorkerRecord]:
    t = table(state, node)
    return {r.job_id: t.with_pids(r) for r in t.records()}


async def run_row(db: asyncpg.Connection, job_id: int) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT state, attempt, restart_count, exit_code, nodes FROM job_runs WHERE job_id = $1",
        job_id,
    )


def running(row: asyncpg.Record | None) -> bool:
    return row is not None and row["state"] == "RUNNING"


def ended_as(state: str, code: int) -> Callable[[asyncpg.Record | None], bool]:
    return lambda r: r is not None and r["state"] == state and r["exit_code"] == code


async def test_a_killed_agent_leaves_its_jobs_running_and_reports_what_ended_meanwhile(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    [node] = nodes(1)
    async with running_cluster(state, nats_url, database_url, db, [node], env=RESTART_ENV) as c:
        jobs = {}
        for name in ("stays", "completes", "fails"):
            script = WAITER.format(dir=work, name=name)
            reply = await submit(nats_url, script, ONE_GPU, workdir=str(work))
            jobs[name] = reply.job_ids[0]
        for job_id in jobs.values():
            await eventually(
                partial(run_row, db, job_id), lambda r: r is not None and r["state"] == "RUNNING"
            )
        before = {name: await run_row(db, j) for name, j in jobs.items()}
        found = await eventually(
            lambda: ready(records(state, node.name)),
            lambda rs: all(r.worker is not None for r in rs.values()) and len(rs) == 3,
            what="three worker records with pids",
        )
        pids = {name: found[j].worker for name, j in jobs.items()}

        kill9(c, f"node-{node.name}")
        assert all(alive(ref) for ref in pids.values()), "workers must outlive their agent"
        (work / "go-completes").write_text("0")
        (work / "go-fails").write_text("3")
        t = table(state, node.name)
        await eventually(
            lambda: ready([t.exit_of(found[jobs[n]]) for n in ("completes", "fails")]),
            lambda ends: all(e is not None and e.ending is Ending.EXITED for e in ends),
            what="both exits recorded on disk while the agent is dead",
        )
        c.start_node(node, **RESTART_ENV)

        await eventually(lambda: run_row(db, jobs["completes"]), ended_as("COMPLETED", 0))
        await eventually(lambda: run_row(db, jobs["fails"]), ended_as("FAILED", 3))
        assert alive(pids["stays"]), "the re-adopted worker is the same process"
        row = await run_row(db, jobs["stays"])
        assert row is not None and row["state"] == "RUNNING"
        assert before["stays"] is not None
        assert (row["attempt"], row["restart_count"]) == (before["stays"]["attempt"], 0)
        left = await eventually(
            lambda: ready(set(records(state, node.name))),
            lambda ids: ids == {jobs["stays"]},
            what="reported records removed",
        )
        assert left == {jobs["stays"]}

        (work / "go-stays").write_text("0")
        row = await eventually(lambda: run_row(db, jobs["stays"]), ended_as("COMPLETED", 0))
        assert row is not None
        assert (row["attempt"], row["restart_count"]) == (before["stays"]["attempt"], 0)
        assert not alive(pids["stays"])


async def test_a_hung_agent_fences_its_job_before_the_job_runs_elsewhere(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    state = tmp_path / "state"
    two = nodes(2)
    async with running_cluster(state, nats_url, database_url, db, two, env=HANG_ENV) as c:
        reply = await submit(nats_url, STUBBORN, ("--nodes=1", "--gpus-per-node=4"))
        job_id = reply.job_ids[0]
        first = await eventually(
            lambda: run_row(db, job_id), lambda r: r is not None and r["state"] == "RUNNING"
        )
        assert first is not None
        victim = first["nodes"][0]
        record, group = await started_worker(state, victim, job_id)

        agent_pid = c.pids[f"node-{victim}"]
        os.kill(agent_pid, signal.SIGSTOP)
        try:
            moved = await moved_off(db, job_id, victim)
            # The moment the database says it runs elsewhere, the old one is gone.
            assert [p for p in group if alive_pid(p)] == []
            assert (
                moved["restart_count"] + moved["attempt"]
                > first["restart_count"] + first["attempt"]
            )
            ending = table(state, victim).exit_of(record)
            assert ending is not None and ending.ending is Ending.FENCED
        finally:
            os.kill(agent_pid, signal.SIGCONT)

        await up_only_when_clean(db, victim, group)
        await eventually(
            lambda: ready(set(records(state, victim))),
            lambda ids: job_id not in ids,
            timeout=30,
            what="the fenced worker's exit reported and its record removed",
        )
        row = await run_row(db, job_id)
        assert row is not None and row["state"] == "RUNNING" and victim not in row["nodes"]


# A hang past the fence but well short of DOWN: the node comes back before the job moves.
FENCE_ONLY_ENV = {
    "MUSTER_HEARTBEAT_TIMEOUT_S": "5",
    "MUSTER_DOWN_AFTER_S": "60",
    "MUSTER_FENCE_S": "3",
}


async def test_a_job_its_node_fenced_is_restarted_not_failed(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """The agent hangs past the fence, so stepd stops the worker (`fenced`), and comes
    back long before the node could be DOWN. The node cut the job off, the job did
    nothing wrong: it is restarted, on the same node (before, the fence's SIGTERM
    failed it)."""
    state = tmp_path / "state"
    [node] = nodes(1)
    async with running_cluster(state, nats_url, database_url, db, [node], env=FENCE_ONLY_ENV) as c:
        job_id = (await submit(nats_url, STUBBORN, ONE_GPU)).job_ids[0]
        first = await eventually(lambda: run_row(db, job_id), running)
        assert first is not None
        record, group = await started_worker(state, node.name, job_id)
        agent_pid = c.pids[f"node-{node.name}"]
        os.kill(agent_pid, signal.SIGSTOP)
        try:
            ending = await eventually(
                lambda: ready(table(state, node.name).exit_of(record)),
                lambda e: e is not None,
                30,
                "stepd fencing the worker",
            )
            assert ending is not None and ending.ending is Ending.FENCED
            assert [p for p in group if alive_pid(p)] == []
        finally:
            os.kill(agent_pid, signal.SIGCONT)
        row = await eventually(
            lambda: run_row(db, job_id),
            lambda r: (
                r is not None
                and r["state"] == "RUNNING"
                and (r["attempt"], r["restart_count"]) != (first["attempt"], first["restart_count"])
            ),
            60,
            "the fenced job running again",
        )
        assert row is not None and row["nodes"] == [node.name]
        outcome = await db.fetchval(
            "SELECT outcome FROM attempts WHERE job_id = $1 AND attempt = $2 AND seq = 0",
            job_id,
            first["attempt"],
        )
        assert "its worker was fenced" in str(outcome), outcome


async def test_a_node_frozen_whole_comes_back_only_once_its_old_job_is_gone(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """Agent, stepd and job all stopped (a frozen machine): nothing can fence while
    frozen; once thawed, the node must not be UP while the moved job's old processes
    run."""
    state = tmp_path / "state"
    async with running_cluster(state, nats_url, database_url, db, nodes(2), env=HANG_ENV) as c:
        reply = await submit(nats_url, STUBBORN, ("--nodes=1", "--gpus-per-node=4"))
        job_id = reply.job_ids[0]
        first = await eventually(lambda: run_row(db, job_id), running)
        assert first is not None
        victim = first["nodes"][0]
        record, group = await started_worker(state, victim, job_id)
        assert record.stepd is not None
        frozen = [c.pids[f"node-{victim}"], record.stepd.pid, *group]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            await moved_off(db, job_id, victim)
        finally:
            for pid in reversed(frozen):  # the job first, its agent last
                os.kill(pid, signal.SIGCONT)
        await up_only_when_clean(db, victim, group)
        assert [p for p in group if alive_pid(p)] == []


async def test_a_worker_left_without_its_stepd_is_killed_by_the_next_agent_and_reported(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """Agent and stepd both SIGKILLed: nothing supervises the worker or could record its
    end, so the next agent kills it and reports it lost; it must not run on unseen. The
    job did nothing wrong: it is restarted, as after a node fault (before, the SIGKILL
    failed it), and may run on the same node again, whose agent is back."""
    state = tmp_path / "state"
    [node] = nodes(1)
    async with running_cluster(state, nats_url, database_url, db, [node], env=RESTART_ENV) as c:
        reply = await submit(nats_url, STUBBORN, ONE_GPU)
        job_id = reply.job_ids[0]
        first = await eventually(lambda: run_row(db, job_id), running)
        assert first is not None
        record, group = await started_worker(state, node.name, job_id)
        assert record.stepd is not None
        kill9(c, f"node-{node.name}")
        os.kill(record.stepd.pid, signal.SIGKILL)
        assert alive(record.worker), "the worker outlives both"
        c.start_node(node, **RESTART_ENV)

        await eventually(
            lambda: ready([p for p in group if alive_pid(p)]),
            lambda left: left == [],
            what="the orphaned worker group killed",
        )
        await eventually(
            lambda: ready(records(state, node.name).get(job_id)),
            lambda rec: rec is None or rec.attempt != record.attempt,
            what="its loss reported and the record removed",
        )
        # The node lost the worker, the job did nothing wrong: it is requeued (not
        # FAILED by the SIGKILL), and runs again once the node is back.
        row = await eventually(
            lambda: run_row(db, job_id),
            lambda r: r is not None and r["state"] == "RUNNING" and r["attempt"] > first["attempt"],
            60,
            what="the lost attempt requeued and the job running again",
        )
        assert row is not None and row["restart_count"] == first["restart_count"] + 1
        outcome = await db.fetchval(
            "SELECT outcome FROM attempts WHERE job_id = $1 AND attempt = $2",
            job_id,
            first["attempt"],
        )
        assert "its worker was lost" in str(outcome), outcome


async def test_srun_steps_outlive_a_killed_agent_and_report_their_own_exits(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """kill -9 of one node's agent while a two-node srun step runs in a job: that node's
    task runs on under its own stepd. The next agent adopts the job's worker and finds
    the task; the launcher, whose request went to the agent that died, asks it again
    and gets the task's own exit when it ends. Each task exits 6 + its node index, so
    the step's exit code (the highest task's) is 7 only with the resumed node's exit;
    srun in the job exits 7 (before, the task was ended by the next agent and the step
    recorded lost). A second step whose task there ends while no agent runs is recorded
    with its exit (3) by the agent that follows. The job stays in its first attempt."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    defs = nodes(2)
    srun = f"{sys.executable} -m muster.cli srun bash -c"

    def task(n: int, base: int) -> str:
        pid, go = f"{work}/task{n}-$SLURM_NODEID.pid", f"{work}/go{n}"
        wait = f"until [ -s {go} ]; do sleep 0.05; done"
        return f"echo $$ > {pid}; {wait}; exit $(({base} + $SLURM_NODEID))"

    script = f"""#!/bin/bash
export MUSTER_KEY_DIR={state / "keys"}
if [ "$SLURM_NODEID" = 0 ]; then
  {srun} '{task(1, 6)}'
  echo "rc=$?" > {work}/srun1.txt
  {srun} '{task(2, 2)}'
  echo "rc=$?" > {work}/srun2.txt
fi
exec sleep 1000
"""
    async with running_cluster(state, nats_url, database_url, db, defs, env=RESTART_ENV) as c:
        spread = ("--nodes=2", "--gpus-per-node=1")
        job_id = (await submit(nats_url, script, spread, workdir=str(work))).job_ids[0]
        first = process_ref(await pid_from(work / "task1-1.pid", 90))
        other = process_ref(await pid_from(work / "task1-0.pid", 30))
        run = await run_row(db, job_id)
        assert run is not None
        node = next(d for d in defs if d.name == run["nodes"][1])  # the step's node 1
        record = records(state, node.name)[job_id]  # its worker runs: it has pids
        kill9(c, f"node-{node.name}")
        await asyncio.sleep(1.0)
        assert alive(first), "the step's task outlives its agent"
        c.start_node(node, **RESTART_ENV)
        # by then the launcher has found the agent back and asked it again, and waited on
        # that request longer than a probe (before, it gave up after one: "did not answer")
        await asyncio.sleep(2 * steps.PROBE_S + 3.0)
        assert alive(first) and alive(other), "the next agent leaves the task running"
        row = await _step(db, job_id, 0)
        assert row["state"] == "RUNNING", dict(row)
        (work / "go1").write_text("x")
        row = await eventually(lambda: _step(db, job_id, 0), lambda r: r["state"] != "RUNNING")
        assert (row["state"], row["exit_code"]) == ("FAILED", 7), dict(row)
        said = work / "srun1.txt"
        await eventually(lambda: ready(said.read_text() if said.exists() else ""), bool)
        assert said.read_text().strip() == "rc=7"  # srun in the job hears the task's exit

        second = process_ref(await pid_from(work / "task2-1.pid", 60))
        kill9(c, f"node-{node.name}")
        (work / "go2").write_text("x")  # the task ends while no agent runs there
        await eventually(lambda: ready(alive(second)), lambda up: not up, 30, "task 2 ended")
        c.start_node(node, **RESTART_ENV)
        row = await eventually(lambda: _step(db, job_id, 1), lambda r: r["state"] != "RUNNING")
        assert (row["state"], row["exit_code"]) == ("FAILED", 3), dict(row)
        said = work / "srun2.txt"
        await eventually(lambda: ready(said.read_text() if said.exists() else ""), bool)
        assert said.read_text().strip() == "rc=3"
        assert alive(record.worker), "the job's worker is adopted, not ended"
        run = await run_row(db, job_id)
        assert run is not None and run["state"] == "RUNNING" and run["restart_count"] == 0
    left = list((state / "nodes").glob("*/steps/*"))
    assert not left, f"task folders go: {left}"


async def test_a_step_task_its_node_lost_requeues_the_job_at_once(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """A two-node job's srun step loses its task on node 1 with its stepd (SIGKILLed, as
    a crash takes them), so that node's agent reports the task lost. The node failed the
    job, the job did not fail: its run ends at once and it is requeued, as Slurm ends a
    job NODE_FAIL and requeues it, while the step's task on node 0 still runs (it is
    stopped with the run). Before, the job ran on with srun waiting on node 0's task;
    once that ended, srun's non-zero status made the batch script FAIL the job."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    srun = f"{sys.executable} -m muster.cli srun bash -c"
    task = f"echo $$ > {work}/task-$SLURM_NODEID.pid; exec sleep 1000"
    script = f"""#!/bin/bash
export MUSTER_KEY_DIR={state / "keys"}
if [ "$SLURM_NODEID" = 0 ] && [ ! -e {work}/ran ]; then
  touch {work}/ran
  {srun} '{task}'
  exit $?
fi
exec sleep 1000
"""
    async with running_cluster(state, nats_url, database_url, db, nodes(2)):
        spread = ("--nodes=2", "--gpus-per-node=1")
        job_id = (await submit(nats_url, script, spread, workdir=str(work))).job_ids[0]
        lost_pid = await pid_from(work / "task-1.pid", 90)
        other_pid = await pid_from(work / "task-0.pid", 30)
        first = await run_row(db, job_id)
        assert first is not None and first["state"] == "RUNNING"
        stepd = _parent(lost_pid)
        assert any("stepd" in part for part in _cmdline(stepd)), _cmdline(stepd)
        os.kill(stepd, signal.SIGKILL)
        row = await eventually(
            lambda: run_row(db, job_id),
            lambda r: r is not None and r["restart_count"] != first["restart_count"],
            60,
            "the job requeued",
        )
        # back in the queue (REQUEUED), or already placed again: not ended
        assert row is not None and row["state"] in (
            "REQUEUED",
            "CONFIGURING",
            "STARTING",
            "RUNNING",
        ), row
        outcome = await db.fetchval(
            "SELECT outcome FROM attempts WHERE job_id = $1 AND attempt = $2 AND seq = 0",
            job_id,
            first["attempt"],
        )
        assert "node02 lost: a task of step" in str(outcome), outcome
        await eventually(lambda: run_row(db, job_id), running, 60, "the job running again")
        step = await eventually(lambda: _step(db, job_id, 0), lambda r: r["state"] != "RUNNING")
        assert step["state"] == "CANCELLED", dict(step)
        assert not alive_pid(lost_pid) and not alive_pid(other_pid), "the old tasks are gone"


async def test_an_srun_pty_terminal_outlives_a_killed_agent(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """kill -9 of the node agent under `srun --pty`: the task's terminal is its stepd's,
    so the shell runs on. What it prints while no agent runs reaches srun once the next
    agent relays the terminal, keys typed then reach the shell, and srun exits with the
    shell's status. The job stays in its first attempt and nothing is left (before, the
    next agent ended the shell and the step was recorded lost)."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    defs = nodes(1)
    async with running_cluster(state, nats_url, database_url, db, defs, env=RESTART_ENV) as c:
        job_id = (await submit(nats_url, "#!/bin/bash\nexec sleep 1000\n", ())).job_ids[0]
        await eventually(lambda: run_row(db, job_id), running, 60, "the job running")
        env = {**os.environ, "SLURM_JOB_ID": str(job_id), "PS1": "remote> "}
        env["MUSTER_NATS_URL"] = nats_url
        srun = Srun([sys.executable, "-m", "muster.cli", "srun", "--pty", "/bin/sh"], env, work)
        try:
            await srun.expect(b"remote> ")
            wait = f"until [ -e {work}/go ]; do sleep 0.05; done"
            srun.type(f"echo $$ > {work}/shell.pid; {wait}; echo away-$((40 + 2))\n")
            shell = process_ref(await pid_from(work / "shell.pid", 30))
            kill9(c, f"node-{defs[0].name}")
            await asyncio.sleep(0.5)
            assert alive(shell), "the terminal's shell outlives its agent"
            (work / "go").write_text("x")  # it prints while no agent runs
            await asyncio.sleep(1.0)
            c.start_node(defs[0], **RESTART_ENV)
            await srun.expect(b"away-42", 60)  # kept by its stepd, relayed by the next agent
            for _ in range(30):  # keys reach it once the next agent relays (and not before)
                srun.type("echo back-$((1 + 1))\n")
                if await srun.expect(b"back-2", 2, fail=False):
                    break
            srun.type("exit 5\n")
            code = await asyncio.to_thread(srun.proc.wait, 60)
            assert code == 5, srun.shown
        finally:
            srun.close()
        row = await _step(db, job_id, 0)
        assert (row["state"], row["exit_code"]) == ("FAILED", 5), dict(row)
        assert not alive(shell)
        run = await run_row(db, job_id)
        assert run is not None and run["state"] == "RUNNING" and run["restart_count"] == 0
    left = list((state / "nodes").glob("*/steps/*"))
    assert not left, f"task folders go: {left}"


class Srun:
    """srun run by the test, its keys from a pipe and its terminal's output to one."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=env, cwd=cwd,
        )  # fmt: skip
        self.shown = b""
        self.seen = 0  # what `expect` already matched
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while data := os.read(self.proc.stdout.fileno(), 65536):
            self.shown += data

    def type(self, keys: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(keys.encode())
        self.proc.stdin.flush()

    async def expect(self, text: bytes, within_s: float = 30.0, *, fail: bool = True) -> bool:
        deadline = time.monotonic() + within_s
        while (at := self.shown.find(text, self.seen)) < 0:
            if time.monotonic() > deadline:
                assert not fail, f"no {text!r} from srun within {within_s} s: {self.shown!r}"
                return False
            await asyncio.sleep(0.05)
        self.seen = at + len(text)
        return True

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def _step(db: asyncpg.Connection, job_id: int, step_id: int) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT state, exit_code, message FROM job_steps WHERE job_id = $1 AND step_id = $2",
        job_id,
        step_id,
    )
    assert row is not None, f"no step {job_id}.{step_id}"
    return row


async def started_worker(state: Path, node: str, job_id: int) -> tuple[WorkerRecord, list[int]]:
    """The job's worker record on `node` (pids known) and its process group once the
    script's `sleep 1000` is in it: two members alone can be the prologue's `mkdir`,
    before the script ran its trap or forked what the test then expects to be killed."""
    record = await eventually(
        lambda: ready(records(state, node).get(job_id)),
        lambda r: r is not None and r.worker is not None and r.stepd is not None,
        what="the worker record with pids",
    )
    assert record is not None
    worker = record.worker
    assert worker is not None
    group = await eventually(
        lambda: ready(group_members(worker.pid)),
        lambda g: any(_cmdline(p) == ["sleep", "1000"] for p in g),
        what="the script's sleep 1000 in the worker's group",
    )
    return record, group


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


async def moved_off(db: asyncpg.Connection, job_id: int, node: str) -> asyncpg.Record:
    row = await eventually(
        lambda: run_row(db, job_id),
        lambda r: r is not None and r["state"] == "RUNNING" and node not in r["nodes"],
        timeout=60,
        what="the job running on another node",
    )
    assert row is not None
    return row


async def up_only_when_clean(
    db: asyncpg.Connection, node: str, old: list[int], timeout: float = 60.0
) -> None:
    """Until `node` is UP again; whenever it is UP, none of `old` may still run."""
    deadline = time.monotonic() + timeout
    while True:
        state = await db.fetchval("SELECT state FROM nodes WHERE name = $1", node)
        left = [p for p in old if alive_pid(p)]
        if state == "UP":
            assert left == [], f"{node} is UP while its old attempt still runs: {left}"
            return
        assert time.monotonic() < deadline, f"{node} never came back UP (last: {state})"
        await asyncio.sleep(0.05)


def alive_pid(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
