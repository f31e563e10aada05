"""Starts behind a site prolog slower than one request's timeout (a node health check, a
mount: seconds). Each start waits for it, and for the start queued behind it, and every
job runs once, in its first attempt (before, the launcher took a start it had not heard
back from in 5 s for failed, requeued the job, and after three tries ended it
NODE_FAIL); the agent stopped or killed while a start waits on it leaves nothing running
unsupervised, and a job stopped while its prolog runs never begins."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import asyncpg

from muster.client import call
from muster.cluster import Cluster, NodeDef
from shared.api import JobSelector, Ok
from tests.support.cluster import (
    eventually,
    job_state,
    kill9,
    nodes,
    running_cluster,
    submit,
)


@contextlib.asynccontextmanager
async def prolog_cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection,
    prolog_body: str, node_defs: list[NodeDef], **env: str,
) -> AsyncIterator[Cluster]:  # fmt: skip
    """A cluster whose nodes run `prolog_body` (sh) as the site prolog, for up to 30 s;
    `env`: more of the nodes' settings."""
    prolog = tmp_path / "prolog.sh"
    prolog.write_text("#!/bin/sh\n" + prolog_body)
    prolog.chmod(0o755)
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        node_defs,
        env={"MUSTER_PROLOG": str(prolog), "MUSTER_HOOK_TIMEOUT_S": "30", **env},
    ) as cluster:
        yield cluster


async def lines_of(path: Path, count: int) -> list[str]:
    """`path`'s lines once there are `count` (RUNNING is once the workers were spawned:
    their lines may come a moment later)."""

    def now() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    return await eventually(lambda: asyncio.to_thread(now), lambda got: len(got) >= count, 30)


async def assert_first_attempt(db: asyncpg.Connection, job_id: int) -> None:
    """Running in its first allocation and generation: nothing was requeued or restarted."""
    row = await db.fetchrow("SELECT attempt, restart_count FROM job_runs WHERE job_id = $1", job_id)
    assert row is not None and (row["attempt"], row["restart_count"]) == (1, 0)


async def test_starts_wait_out_a_slow_prolog_and_each_job_runs_once(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    runs = tmp_path / "runs"
    async with prolog_cluster(
        tmp_path, nats_url, database_url, db, "sleep 8\n", nodes(1)
    ) as cluster:
        script = f'#!/bin/bash\necho "run $SLURM_JOB_ID" >> {runs}\nsleep 600\n'
        jobs: list[int] = []
        for _ in range(2):  # the second start waits behind the first one's prolog
            reply = await submit(cluster.nats_url, script, ("--gpus-per-node=1",), str(tmp_path))
            jobs += reply.job_ids
        for job_id in jobs:
            await eventually(partial(job_state, db, job_id), lambda s: s == "RUNNING", 90)
            await assert_first_attempt(db, job_id)
            assert await db.fetchval("SELECT count(*) FROM attempts WHERE job_id = $1", job_id) == 1
        assert sorted(await lines_of(runs, 2)) == [f"run {j}" for j in sorted(jobs)]


async def test_an_agent_stopped_while_a_start_waits_on_the_prolog_leaves_nothing_running(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """A clean stop of the agent (SIGTERM) while a start waits on the prolog: the start
    under way is stopped, so nothing of it runs on after the agent (before, it ended
    after the agent's last look at its workers, and its worker ran on with no agent),
    and its worker never begins (before, it was spawned once the prolog ended, then
    stopped)."""
    began, pid_file = tmp_path / "began", tmp_path / "pid"
    async with prolog_cluster(
        tmp_path, nats_url, database_url, db, f": > {began}\nsleep 2\n", nodes(1)
    ) as cluster:
        script = f"#!/bin/bash\necho $$ > {pid_file}\nexec sleep 600\n"
        await submit(cluster.nats_url, script, ("--gpus-per-node=1",), str(tmp_path))
        await eventually(lambda: asyncio.to_thread(began.exists), bool, 30, "the prolog")
        cluster.kill("node-node01", signal.SIGTERM)
        await asyncio.to_thread(os.waitpid, cluster.pids["node-node01"], 0)  # it stopped
        # The agent waited for the start under way: had its worker begun, it was first
        assert not pid_file.exists()  # (the agent's stop came while the prolog ran)


async def test_an_agent_killed_while_a_start_waits_on_the_prolog_adopts_that_start(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """kill -9 of the agent while its stepd waits on the prolog, and a new agent at once:
    the stepd is on record from the moment it was handed the worker, so the new agent
    adopts it, and the launcher, asking again, hears it runs. The job runs once, in its
    first attempt (before, the new agent reported it lost: the stepd went on to spawn a
    worker it could no longer record, and the job was requeued)."""
    began, runs = tmp_path / "began", tmp_path / "runs"
    [node] = nodes(1)
    async with prolog_cluster(
        tmp_path, nats_url, database_url, db, f": > {began}\nsleep 6\n", [node]
    ) as cluster:
        script = f'#!/bin/bash\necho "run $SLURM_JOB_ID" >> {runs}\nexec sleep 600\n'
        reply = await submit(cluster.nats_url, script, ("--gpus-per-node=1",), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: asyncio.to_thread(began.exists), bool, 30, "the prolog")
        kill9(cluster, "node-node01")
        cluster.start_node(node)
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 90)
        await assert_first_attempt(db, job_id)
        assert await lines_of(runs, 1) == [f"run {job_id}"]


async def test_a_job_cancelled_while_its_prolog_runs_never_begins_and_its_epilog_runs(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """scancel while the site prolog runs: the agent hands the stop to the start's
    stepd, which keeps it and never spawns the worker, so no line of a job its user
    cancelled runs; the epilog runs after it, as after any job whose prolog ran
    (before, the worker was spawned once the prolog ended, and stopped only then)."""
    began, ran, ended = tmp_path / "began", tmp_path / "ran", tmp_path / "epilog.log"
    epilog = tmp_path / "epilog.sh"
    epilog.write_text(f'#!/bin/sh\necho "$SLURM_JOB_ID" >> {ended}\n')
    epilog.chmod(0o755)
    async with prolog_cluster(
        tmp_path, nats_url, database_url, db, f": > {began}\nsleep 3\n", nodes(1),
        MUSTER_EPILOG=str(epilog),
    ) as cluster:  # fmt: skip
        script = f"#!/bin/bash\n: > {ran}\nexec sleep 600\n"
        reply = await submit(cluster.nats_url, script, ("--gpus-per-node=1",), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: asyncio.to_thread(began.exists), bool, 30, "the prolog")
        await call(cluster.nats_url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)
        await eventually(lambda: job_state(db, job_id), lambda s: s == "CANCELLED", 30)
        assert await lines_of(ended, 1) == [str(job_id)]  # stepd's last act: after it,
        assert not ran.exists()  # no worker of this job can begin
