"""End to end, on real NATS, PostgreSQL and processes: GPU health. Faults are injected
at the simulated GPU of a node agent, so they travel probe -> monitor -> placer and
launcher exactly as in production; nodes come back by a (simulated) reboot and its
health check, or by an operator."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from muster.client import agent, call
from muster.cluster import Cluster
from shared.api import InjectFault, NodeAction, NodesReply, Ok, QueueRequest
from tests.support.cluster import (
    FAST,
    eventually,
    inject,
    job_state,
    kill9,
    nodes,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

NODES = nodes(3)
SLEEPER = "#!/bin/bash\nsleep 30\n"
TIMEOUT_S = float(FAST["MUSTER_HEARTBEAT_TIMEOUT_S"])


@pytest.fixture
async def cluster(tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection):
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, list(NODES)) as c:
        yield c


async def node_state(db: asyncpg.Connection, node: str) -> str:
    state: str = await db.fetchval("SELECT state FROM nodes WHERE name = $1", node)
    return state


async def running_job(db: asyncpg.Connection, url: str, workdir: Path) -> tuple[int, str]:
    """A fixed-size one-node job that holds all four GPUs of its node, and that node."""
    reply = await submit(url, SLEEPER, ("--nodes=1", "--gpus-per-node=4"), workdir=str(workdir))
    job_id = reply.job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", what="running")
    nodes_: list[str] = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    return job_id, nodes_[0]


async def reboot(url: str, node: str) -> None:
    await agent(url, node, "reboot", InjectFault())


async def test_xid_79_takes_the_node_out_and_its_fixed_size_job_restarts_elsewhere(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)

    await inject(cluster.nats_url, victim, 79, gpu=1)

    await eventually(lambda: node_state(db, victim), lambda s: s == "FAILED", what="FAILED")
    row = await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r["state"] == "RUNNING" and victim not in r["nodes"],
        what="the job running again on another node",
    )
    assert len(row["nodes"]) == 1
    gpu = await db.fetchrow(
        "SELECT healthy, last_xid FROM gpus WHERE node = $1 AND idx = 1", victim
    )
    assert (gpu["healthy"], gpu["last_xid"]) == (False, 79)
    view = await call(cluster.nats_url, "nodes", QueueRequest(user="root"), NodesReply)
    [shown] = [n for n in view.nodes if n.name == victim]
    assert shown.state == "FAILED" and shown.last_fault is not None
    assert shown.last_fault["xid"] == 79 and not shown.gpus[1].healthy

    # The reboot clears it: a new boot passes its health check and the node is UP.
    await reboot(cluster.nats_url, victim)
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP again")
    assert await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", victim)


async def test_xid_13_fails_only_the_job_and_the_node_stays_up(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, node = await running_job(db, cluster.nats_url, tmp_path)

    await inject(cluster.nats_url, node, 13, gpu=2)

    await eventually(lambda: job_state(db, job_id), lambda s: s == "FAILED", what="job FAILED")
    reason = await db.fetchval("SELECT reason FROM job_runs WHERE job_id = $1", job_id)
    assert "xid 13" in reason
    assert await node_state(db, node) == "UP"
    assert await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", node)
    assert await db.fetchval("SELECT last_xid FROM gpus WHERE node = $1 AND idx = 2", node) == 13

    # And the node takes new work.
    again = await submit(cluster.nats_url, "#!/bin/bash\ntrue\n", (f"--nodelist={node}",))
    await eventually(
        lambda: job_state(db, again.job_ids[0]), lambda s: s == "COMPLETED", what="new job"
    )


async def test_a_killed_node_agent_is_down_within_the_timeout_and_its_job_moves(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)

    killed_at = time.monotonic()
    kill9(cluster, f"node-{victim}")

    await eventually(lambda: node_state(db, victim), lambda s: s == "DOWN", timeout=30, what="DOWN")
    # Timeout after the last heartbeat (sent at most one interval before the kill),
    # plus one liveness pass of timeout / 4.
    assert time.monotonic() - killed_at < TIMEOUT_S + TIMEOUT_S / 4 + 3.0  # + a busy machine
    await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r["state"] == "RUNNING" and victim not in r["nodes"],
        what="the job running again on another node",
    )

    # A restarted agent is a new boot: it passes its health check and is UP again.
    [node] = [n for n in NODES if n.name == victim]
    cluster.start_node(node)
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP again")


async def test_a_flapping_node_stays_out_until_an_operator_resumes_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    node = NODES[0].name
    url = cluster.nats_url
    for attempt in range(3):
        await inject(url, node, 79, gpu=attempt)
        await eventually(lambda: node_state(db, node), lambda s: s == "FAILED", what="FAILED")
        before = await db.fetchval("SELECT boot_id FROM nodes WHERE name = $1", node)
        await reboot(url, node)
        if attempt < 2:
            await eventually(lambda: node_state(db, node), lambda s: s == "UP", what="UP")

    # The third failure within the window holds it: a passing check is not enough.
    await eventually(
        lambda: db.fetchval("SELECT last_check->>'boot_id' FROM nodes WHERE name = $1", node),
        lambda boot: boot not in (None, before),
        what="the check after the last reboot",
    )
    row = await db.fetchrow("SELECT state, held, reason FROM nodes WHERE name = $1", node)
    assert row["held"] and row["state"] == "FAILED" and "flapping" in row["reason"]
    await asyncio.sleep(1.0)
    assert await node_state(db, node) == "FAILED"

    await call(url, "resume", NodeAction(user="root", node=node, reason="replaced the riser"), Ok)
    await eventually(lambda: node_state(db, node), lambda s: s == "UP", what="resumed")
    assert not await db.fetchval("SELECT held FROM nodes WHERE name = $1", node)


async def test_a_gpu_reset_xid_drains_the_node_and_the_reset_brings_it_back(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, node = await running_job(db, cluster.nats_url, tmp_path)
    await inject(cluster.nats_url, node, 62, gpu=1)

    await eventually(lambda: node_state(db, node), lambda s: s != "UP", 20, "out of service")
    # The job moves away (its node is drained), the idle node is reset, checked, and back.
    await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r["state"] == "RUNNING" and node not in r["nodes"],
        30,
        "job moved",
    )
    await eventually(lambda: node_state(db, node), lambda s: s == "UP", 30, "back in service")
    healthy = await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", node)
    assert healthy
    fault = await db.fetchval("SELECT last_fault FROM nodes WHERE name = $1", node)
    assert '"xid": 62' in fault
