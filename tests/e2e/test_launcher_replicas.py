"""End to end: two launcher replicas (real processes on real NATS and PostgreSQL) share
the jobs by shard (services/launcher/owners.py). Both run jobs; the owner of a running
job SIGKILLed, the other takes the job over and its time limit still fires on time
(the persisted deadline); the owner SIGSTOPped past its lease, the other acts on a
cancel, and the resumed one writes nothing and starts or stops nothing (fencing); a
repeated start of a generation that already ran runs nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import asyncpg
import msgspec
import pytest

from muster.client import agent, call
from muster.cluster import Cluster
from services.launcher.gang import Generation, launcher_signer, worker_spec
from shared.api import AgentReply, JobSelector, Ok, StopWorkers
from shared.jobspec import JobSpec
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

LEASE_S = 2.0
RECORDS_ITSELF = """#!/bin/bash
echo $$ > "pid-$MUSTER_JOB_ID-$MUSTER_ATTEMPT-$MUSTER_GENERATION"
exec sleep 600
"""
QUICK = "#!/bin/bash\nsleep 1\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(3),
        replicas={"launcher": 2},
        env={"MUSTER_LAUNCHER_LEASE_S": str(LEASE_S)},
    ) as c:
        yield c


async def holders(db: asyncpg.Connection) -> set[str]:
    rows = await db.fetch("SELECT DISTINCT holder FROM launcher_shards WHERE expires_at > now()")
    return {r["holder"] for r in rows}


async def owner(db: asyncpg.Connection, job_id: int) -> str | None:
    holder: str | None = await db.fetchval(
        "SELECT holder FROM launcher_shards WHERE shard = launcher_shard($1)"
        " AND expires_at > now()",
        job_id,
    )
    return holder


def key_of(holder: str) -> str:
    """The process key of a shard holder (`launcher-<instance>-<pid>-<nonce>`)."""
    instance = holder.split("-")[1]
    return "launcher" if instance == "0" else f"launcher-{instance}"


async def running(cluster: Cluster, db: asyncpg.Connection, workdir: Path, *args: str) -> int:
    job_id = (await submit(cluster.nats_url, RECORDS_ITSELF, args, str(workdir))).job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
    return job_id


async def worker_pid(workdir: Path, job_id: int) -> int:
    return await pid_from(workdir / f"pid-{job_id}-1-0")


async def test_two_launchers_share_the_shards_and_both_run_jobs(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    both = await eventually(lambda: holders(db), lambda h: len(h) == 2, 60, "the shards shared")
    assert {key_of(h) for h in both} == {"launcher", "launcher-1"}
    reply = await submit(cluster.nats_url, QUICK, ("--array=1-8",), str(tmp_path))
    for job_id in reply.job_ids:
        await eventually(partial(job_state, db, job_id), lambda s: s == "COMPLETED", 90, "done")
    owners = {await owner(db, j) for j in reply.job_ids}
    assert owners <= both and len(owners) == 2  # 8 consecutive ids span both halves


async def test_a_killed_owners_job_is_taken_over_and_times_out_on_time(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await eventually(lambda: holders(db), lambda h: len(h) == 2, 60, "the shards shared")
    job_id = await running(cluster, db, tmp_path, "--time=0:15")
    pid = await worker_pid(tmp_path, job_id)
    first = await owner(db, job_id)
    assert first is not None

    kill9(cluster, key_of(first))
    await eventually(
        lambda: owner(db, job_id), lambda h: h is not None and h != first, 30, "a new owner"
    )
    await eventually(lambda: job_state(db, job_id), lambda s: s == "TIMEOUT", 60, "timed out")
    row = await db.fetchrow(
        "SELECT extract(epoch FROM ended_at - started_at)::float8 AS ran FROM job_runs"
        " WHERE job_id = $1",
        job_id,
    )
    assert row is not None
    assert 13.0 <= row["ran"] < 15.0 + 10.0  # the deadline from the table, not restarted
    await eventually(lambda: asyncio.to_thread(process_alive, pid), lambda a: not a, 30, "gone")


async def test_a_paused_owner_loses_its_job_and_its_resumed_writes_are_refused(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    await eventually(lambda: holders(db), lambda h: len(h) == 2, 60, "the shards shared")
    job_id = await running(cluster, db, tmp_path)
    pid = await worker_pid(tmp_path, job_id)
    first = await owner(db, job_id)
    assert first is not None
    old_key = key_of(first)
    old_epoch = await db.fetchval(
        "SELECT epoch FROM launcher_shards WHERE shard = launcher_shard($1)", job_id
    )

    os.kill(cluster.pids[old_key], signal.SIGSTOP)
    try:
        await eventually(
            lambda: owner(db, job_id), lambda h: h is not None and h != first, 60, "a takeover"
        )
        await call(cluster.nats_url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)
        await eventually(lambda: job_state(db, job_id), lambda s: s == "CANCELLED", 60, "ended")
        await eventually(
            lambda: asyncio.to_thread(process_alive, pid), lambda a: not a, 30, "stopped"
        )
        before = await db.fetchrow("SELECT * FROM job_runs WHERE job_id = $1", job_id)
    finally:
        os.kill(cluster.pids[old_key], signal.SIGCONT)
    log = cluster.state_dir / "logs" / f"{old_key}.log"
    await eventually(
        lambda: asyncio.to_thread(log.read_text), lambda t: "lost shards" in t, 30, "it noticed"
    )
    await asyncio.sleep(3 * LEASE_S)  # whatever the resumed replica had in hand, it tried

    assert await db.fetchrow("SELECT * FROM job_runs WHERE job_id = $1", job_id) == before
    seqs = await db.fetch("SELECT attempt, seq FROM attempts WHERE job_id = $1", job_id)
    assert [(r["attempt"], r["seq"]) for r in seqs] == [(1, 0)]  # nothing ran twice
    started = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.glob("pid-*")))
    assert started == [f"pid-{job_id}-1-0"]  # no worker started since
    # And the database itself refuses the deposed replica (the trigger, the last defence).
    with pytest.raises(asyncpg.RaiseError, match="fenced off"):
        async with db.transaction():
            await db.execute(
                "SELECT set_config('muster.launcher_holder', $1, true),"
                " set_config('muster.launcher_epoch', $2, true)",
                first,
                str(old_epoch),
            )
            await db.execute("UPDATE job_runs SET reason = 'stale' WHERE job_id = $1", job_id)


async def test_a_repeated_start_of_a_generation_that_ended_runs_nothing(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """A new owner relaunches a STARTING run it cannot know already ran: the agent
    answers that it did, and starts no second worker of that generation."""
    script = '#!/bin/bash\necho ran >> "runs-$MUSTER_JOB_ID"\n'
    job_id = (await submit(cluster.nats_url, script, (), str(tmp_path))).job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 60, "done")
    row = await db.fetchrow("SELECT nodes, gpus FROM job_runs WHERE job_id = $1", job_id)
    assert row is not None
    raw = await db.fetchval("SELECT spec FROM jobs WHERE job_id = $1", job_id)
    spec = msgspec.json.decode(raw, type=JobSpec)
    node = row["nodes"][0]
    gen = Generation(
        job_id=job_id, attempt=1, generation=0, nodes=(node,), gpus=json.loads(row["gpus"])
    )
    signer = launcher_signer(str(cluster.state_dir))  # the launcher's own key, as it signs
    assert signer is not None
    body = signer.sign(worker_spec(spec, gen, node, "127.0.0.1", 29500), node, now=time.time())
    reply = msgspec.json.decode(await agent(cluster.nats_url, node, "start", body), type=AgentReply)
    assert (reply.ok, reply.message) == (True, "already ran")
    await asyncio.sleep(2)
    runs = tmp_path / f"runs-{job_id}"
    assert (await asyncio.to_thread(runs.read_text)).splitlines() == ["ran"]


async def test_a_start_that_arrives_after_its_stop_runs_nothing(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """The launcher ended a generation and stopped it on every node while one node's
    start was still on its way (chaos seed 308): that start must not run a worker of an
    ended run, which would hold GPUs the placer has given to the next job."""
    script = '#!/bin/bash\necho ran >> "runs-$MUSTER_JOB_ID"\n'
    job_id = (await submit(cluster.nats_url, script, (), str(tmp_path))).job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 60, "done")
    row = await db.fetchrow("SELECT nodes, gpus FROM job_runs WHERE job_id = $1", job_id)
    assert row is not None
    raw = await db.fetchval("SELECT spec FROM jobs WHERE job_id = $1", job_id)
    spec = msgspec.json.decode(raw, type=JobSpec)
    node = row["nodes"][0]
    late = Generation(  # a generation this node never ran
        job_id=job_id, attempt=1, generation=7, nodes=(node,), gpus=json.loads(row["gpus"])
    )
    signer = launcher_signer(str(cluster.state_dir))
    assert signer is not None
    stop = StopWorkers(job_id=job_id, grace_s=1.0, attempt=1, generation=7)
    body = signer.sign(stop, node, now=time.time())
    reply = msgspec.json.decode(await agent(cluster.nats_url, node, "stop", body), type=AgentReply)
    assert (reply.ok, reply.message) == (True, "not running")
    start = signer.sign(worker_spec(spec, late, node, "127.0.0.1", 29500), node, now=time.time())
    raw = await agent(cluster.nats_url, node, "start", start)
    reply = msgspec.json.decode(raw, type=AgentReply)
    assert (reply.ok, reply.message) == (True, "stopped before it started")
    await asyncio.sleep(2)
    runs = tmp_path / f"runs-{job_id}"
    assert (await asyncio.to_thread(runs.read_text)).splitlines() == ["ran"]
