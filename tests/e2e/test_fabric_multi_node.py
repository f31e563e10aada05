"""A node whose fabric link trained down to a lower speed stays UP for single-node work
and out of multi-node jobs, end to end: every agent watches the port the cluster
configuration's node set names (`fabric = ["mlx5_0/1"]`, no MUSTER_FABRIC) in its own
fake sysfs tree (MUSTER_FABRIC_ROOT, read by the same code as the real /sys), the test
lowers one port's rate, and the monitor's flag reaches the placer: a 2-node job goes
around the node, a 1-node job lands on it, `muster nodes` says why, and the flag goes
once the rate is back for the stable period."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.cluster import Cluster
from shared.api import NodesReply, QueueRequest
from tests.support.cluster import eventually, job_state, make_cluster, nodes, nodes_up, submit
from tests.unit.health.test_fabric import fake_port

pytestmark = pytest.mark.slow

SLEEPER = "#!/bin/bash\nsleep 120\n"
FLAGGED = "node01"  # first in topology order: a gang takes it unless told not to
CONFIG = """
[roles]
operators = ["root", "admin"]

[node_sets.gpu]
nodes = "node[01-03]"
fabric = ["mlx5_0/1"]

[partitions.normal]
nodes = ["gpu"]
"""


@contextlib.asynccontextmanager
async def fake_fabric_cluster(
    tmp: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[dict[str, Path]]:
    """Three one-GPU nodes (node01 and node03 on leaf1), each watching its own port."""
    defs = nodes(3, gpus=1)
    ports = {d.name: fake_port(tmp / "sysfs" / d.name, "mlx5_0", "1") for d in defs}
    cluster: Cluster | None = None
    try:
        cluster = make_cluster(tmp / "state", nats_url, database_url)
        config = tmp / "cluster.toml"
        config.write_text(CONFIG)
        identity = os.environ["MUSTER_CLUSTER_CONFIG"]
        os.environ["MUSTER_CLUSTER_CONFIG"] = str(config)  # every process's, agents' too
        try:
            cluster.start_services()
            for d in defs:
                cluster.start_node(
                    d,
                    MUSTER_FABRIC_ROOT=str(tmp / "sysfs" / d.name),
                    MUSTER_FABRIC_POLL_S="0.2",
                    MUSTER_FABRIC_STABLE_S="2",
                )
        finally:
            os.environ["MUSTER_CLUSTER_CONFIG"] = identity
        await nodes_up(db, len(defs), timeout=60)
        yield ports
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop_all, 10)


async def excluded(db: asyncpg.Connection, node: str) -> tuple[str, str, str]:
    row = await db.fetchrow(
        "SELECT state, multi_node_excluded::text AS x, reason FROM nodes WHERE name = $1", node
    )
    assert row is not None
    return row["state"], row["x"], row["reason"]


async def running_on(db: asyncpg.Connection, job_id: int) -> list[str]:
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
    got: list[str] = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    return got


async def test_a_degraded_link_keeps_its_node_out_of_a_gang_but_not_of_a_one_node_job(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with fake_fabric_cluster(tmp_path, nats_url, database_url, db) as ports:
        (ports[FLAGGED] / "rate").write_text("100 Gb/sec (4X HDR)\n")  # trained down
        state, flag, reason = await eventually(
            lambda: excluded(db, FLAGGED), lambda r: r[1] != "{}", 60, "the flag"
        )
        assert state == "UP" and "mlx5_0/1" in flag
        assert reason == "multi-node excluded: mlx5_0/1 speed degraded: 100 of 200 Gb/s"

        gang = await submit(nats_url, SLEEPER, ("--nodes=2", "--gpus-per-node=1"), str(tmp_path))
        assert sorted(await running_on(db, gang.job_ids[0])) == ["node02", "node03"]
        single = await submit(nats_url, SLEEPER, ("--gpus-per-node=1",), str(tmp_path))
        assert await running_on(db, single.job_ids[0]) == [FLAGGED]

        view = await call(nats_url, "nodes", QueueRequest(user="root"), NodesReply)
        [shown] = [n for n in view.nodes if n.name == FLAGGED]
        assert (shown.state, shown.reason) == ("UP", reason)

        (ports[FLAGGED] / "rate").write_text("200 Gb/sec (4X HDR)\n")  # back, stays back
        await eventually(
            lambda: excluded(db, FLAGGED), lambda r: r == ("UP", "{}", ""), 60, "the flag lifted"
        )
        assert await job_state(db, gang.job_ids[0]) == "RUNNING"  # untouched throughout
