"""End to end, on real NATS, PostgreSQL and processes: the launcher's level-triggered
side. An allocation whose `job.allocated` never reached the launcher still starts; a
node reported down is still asked to stop its workers; a node that registers gets its
`node.cleaned` answer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats
import pytest

from muster.cluster import Cluster
from shared.events import NodeCleaned, NodeDown, NodeRegistered, RunningWorker, decode
from tests.support.cluster import (
    eventually,
    job_state,
    nodes,
    pid_from,
    process_alive,
    publish_event,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

RECORDS_ITSELF = """#!/bin/bash
echo "node=$MUSTER_NODE gpus=$CUDA_VISIBLE_DEVICES attempt=$MUSTER_ATTEMPT gen=$MUSTER_GENERATION"
echo $$ > "pid-$MUSTER_NODE-$MUSTER_GENERATION"
exec sleep 600
"""


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(2)) as c:
        yield c


async def allocate_behind_the_launchers_back(
    db: asyncpg.Connection, job_id: int, node: str, gpus: list[int]
) -> None:
    """Write an allocation as the leading placer would, under its epoch, but publish no
    `job.allocated`: the one way the launcher can learn of it is the table."""
    async with db.transaction():
        epoch = await db.fetchval("SELECT epoch FROM placer_lease WHERE id = 1")
        alloc_id = await db.fetchval(
            "INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, 1, $2) RETURNING alloc_id",
            job_id,
            epoch,
        )
        await db.execute(
            "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus) VALUES ($1, $2, 0, $3)",
            alloc_id,
            node,
            gpus,
        )
        await db.executemany(
            "INSERT INTO allocation_gpus(alloc_id, node, gpu) VALUES ($1, $2, $3)",
            [(alloc_id, node, g) for g in gpus],
        )


async def running_on_node01(cluster: Cluster, db: asyncpg.Connection, tmp_path: Path) -> int:
    reply = await submit(cluster.nats_url, RECORDS_ITSELF, ("-w", "node01"), str(tmp_path))
    job_id = reply.job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 30, "running")
    return job_id


async def test_an_allocation_whose_job_allocated_never_arrived_is_started_from_its_row(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # Held, so the placer leaves it alone: only our allocation row can start it.
    reply = await submit(
        cluster.nats_url, RECORDS_ITSELF, ("--hold", "--gpus-per-node=2"), str(tmp_path)
    )
    job_id = reply.job_ids[0]
    await allocate_behind_the_launchers_back(db, job_id, "node02", [3, 1])

    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 40, "running")
    out = tmp_path / f"slurm-{job_id}.out"
    text = await eventually(lambda: asyncio.to_thread(_read, out), bool, 20, "output")
    # What the row said, not what any event could have: its node, its GPUs, attempt 1.
    assert text.splitlines()[0] == "node=node02 gpus=1,3 attempt=1 gen=0", text
    row = await db.fetchrow("SELECT attempt, nodes FROM job_runs WHERE job_id = $1", job_id)
    assert row is not None and (row["attempt"], row["nodes"]) == (1, ["node02"])
    started = await db.fetchval("SELECT count(*) FROM attempts WHERE job_id = $1", job_id)
    assert started == 1  # one start, however many reconcile passes saw the row


async def test_a_node_reported_down_is_asked_to_stop_the_workers_it_still_runs(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await running_on_node01(cluster, db, tmp_path)
    pid = await pid_from(tmp_path / "pid-node01-0", 20)
    assert process_alive(pid)

    # node01's agent is alive, as behind a partition the monitor cannot see through:
    # node.down must still reach it and end its worker, not leave it running.
    await publish_event(cluster.nats_url, NodeDown(node="node01", reason="silent (test)"))

    await eventually(lambda: asyncio.to_thread(process_alive, pid), lambda a: not a, 30, "gone")
    await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] == "RUNNING" and r["nodes"] == ["node02"],
        40,
        "restarted on the spare",
    )


async def test_a_registering_node_gets_node_cleaned_after_its_stale_workers_are_stopped(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await running_on_node01(cluster, db, tmp_path)
    boot = await db.fetchval("SELECT boot_id FROM nodes WHERE name = 'node02'")

    # node02 re-registers claiming a worker of the job, which runs on node01 only: stale.
    stale = RunningWorker(job_id=job_id, attempt=1, generation=0)
    ghost = NodeRegistered(node="node02", address="127.0.0.1", gpus=(), boot_id=boot,
                           running=(stale,))  # fmt: skip
    await publish_event(cluster.nats_url, ghost)

    cleaned = await eventually(
        lambda: last_cleaned(cluster.nats_url, "node02"),
        lambda c: c is not None and c.stopped == (stale,),
        30,
        "node.cleaned for node02",
    )
    assert cleaned is not None and cleaned.boot_id == boot
    assert await db.fetchval("SELECT count(*) FROM node_cleanings") == 0
    assert await job_state(db, job_id) == "RUNNING"  # the live worker on node01 untouched
    assert process_alive(await pid_from(tmp_path / "pid-node01-0"))


async def last_cleaned(url: str, node: str) -> NodeCleaned | None:
    nc = await nats.connect(url)
    try:
        msg = await nc.jetstream().get_last_msg("MUSTER", "muster.node.cleaned")
    except nats.js.errors.NotFoundError:
        return None
    finally:
        await nc.close()
    event = decode(msg.data or b"")
    return event if isinstance(event, NodeCleaned) and event.node == node else None


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
