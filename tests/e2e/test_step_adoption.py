"""End to end: a job step (srun) outlives the launcher replica that coordinates it.

Two launcher replicas; a batch job's srun starts a step whose task waits for a file.
The replica coordinating the step (its name on the step's row) is SIGKILLed mid-step:
the task keeps running, the other replica's sweep claims the step once its lease runs
out and asks the agent again (adopt), the task ends with 7 and the step's row says so
(FAILED, exit code 7, from the database), srun in the job gets 7 as its exit status,
and no process of the step is left. `srun --pty` (its terminal a file here) outlives
its coordinator the same way: it asks again as a batch srun does. A RUNNING row no
agent knows (its launch never reached one) is claimed too and ends FAILED as lost,
not RUNNING for ever."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import (
    eventually,
    job_state,
    kill9,
    nodes,
    pid_from,
    process_alive,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

PY = sys.executable
STEP = "SELECT state, exit_code, coordinator FROM job_steps WHERE job_id = $1 AND step_id = 0"


def script(work: Path, keys: Path, srun: str = "srun", code: int = 7) -> str:
    task = f"echo $$ > {work}/task.pid; while [ ! -f {work}/go ]; do sleep 0.1; done; exit {code}"
    return f"""#!/bin/bash
export MUSTER_KEY_DIR={keys}
{PY} -m muster.cli {srun} bash -c '{task}' < /dev/null
echo "rc=$?" > {work}/srun.txt
"""


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(1),
        replicas={"launcher": 2},
        env={"MUSTER_LAUNCHER_LEASE_S": "1"},
    ) as c:
        yield c


def key_of(holder: str) -> str:
    """The process key of a launcher holder name (`launcher-<instance>-<pid>-<nonce>`)."""
    instance = holder.split("-")[1]
    return "launcher" if instance == "0" else f"launcher-{instance}"


async def adopted_after_kill(
    cluster: Cluster, db: asyncpg.Connection, work: Path, srun: str, code: int
) -> tuple[int, int]:
    """Submit the script, kill -9 the replica coordinating its step once the task runs,
    wait for another to adopt it: the job and the task's pid (still alive)."""
    text = script(work, work.parent / "state" / "keys", srun, code)
    job = (await submit(cluster.nats_url, text, ("-t", "5"), str(work))).job_ids[0]
    pid = await pid_from(work / "task.pid", 90)  # the step's task runs
    row = await db.fetchrow(STEP, job)
    assert row is not None and row["state"] == "RUNNING"
    first = row["coordinator"]
    kill9(cluster, key_of(first))
    await eventually(
        lambda: db.fetchrow(STEP, job),
        lambda r: r is not None and r["coordinator"] != first,
        60,
        "the step adopted",
    )
    assert process_alive(pid)  # the task ran on through its coordinator's death
    return job, pid


async def released_and_ended(
    db: asyncpg.Connection, work: Path, job: int, pid: int, code: int
) -> None:
    """Let the task end with `code`: the step's row, the job, srun's status and the
    machine all say so."""
    (work / "go").touch()
    ended = await eventually(
        lambda: db.fetchrow(STEP, job),
        lambda r: r is not None and r["state"] != "RUNNING",
        60,
        "the step's end recorded",
    )
    assert ended is not None and (ended["state"], ended["exit_code"]) == ("FAILED", code)
    await eventually(lambda: job_state(db, job), lambda s: s == "COMPLETED", 60, "the job ends")
    assert (work / "srun.txt").read_text().strip() == f"rc={code}"
    assert not process_alive(pid)


async def test_a_step_whose_launcher_dies_is_adopted_and_srun_gets_its_exit(
    cluster: Cluster, tmp_path: Path, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    job, pid = await adopted_after_kill(cluster, db, work, "srun", 7)
    await db.execute(
        "INSERT INTO job_steps(job_id, step_id, attempt, argv, nodes, ntasks, state)"
        " SELECT job_id, 1, attempt, '{true}', '{node01}', 1, 'RUNNING' FROM job_runs"
        " WHERE job_id = $1",
        job,
    )
    lost = await eventually(
        lambda: db.fetchrow(
            "SELECT state, message FROM job_steps WHERE job_id = $1 AND step_id = 1", job
        ),
        lambda r: r is not None and r["state"] != "RUNNING",
        60,
        "a step no agent knows ends",
    )
    assert lost is not None and lost["state"] == "FAILED" and "not known" in lost["message"]
    await released_and_ended(db, work, job, pid, 7)


async def test_a_terminal_step_outlives_its_launcher_and_srun_gets_its_exit(
    cluster: Cluster, tmp_path: Path, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    job, pid = await adopted_after_kill(cluster, db, work, "srun --pty", 5)
    await released_and_ended(db, work, job, pid, 5)
