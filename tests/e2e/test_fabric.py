"""Fabric faults close the loop like an XID, on real kernel links: every node agent in
its own network namespace (tests/support/netns.py) watches `fab0`, a veth link made in
that namespace and named as the node's fabric (MUSTER_FABRIC). Taking the link down
mid-job drains the node with a `node.fault` naming the link, the elastic job shrinks
onto the survivors, and bringing the link up returns the node after the stable period.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.cluster import Cluster
from shared import embedded
from shared.api import NodesReply, QueueRequest, ShowJobReply, ShowJobRequest
from tests.support import netns
from tests.support.cluster import eventually, job_state, make_cluster, nodes, nodes_up, submit

WHY_NOT = netns.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-")]

LINK = "fab0"
FABRIC_ENV = {
    "MUSTER_FABRIC": LINK,
    "MUSTER_FABRIC_POLL_S": "0.5",
    "MUSTER_FABRIC_DOWN_GRACE_S": "1",
    "MUSTER_FABRIC_STABLE_S": "3",
}
ELASTIC = """#!/bin/bash
echo "start node=$MUSTER_NODE world=$WORLD_SIZE restart=$MUSTER_RESTART_COUNT"
sleep 120
"""


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def add_fabric_link(namespace: str) -> None:
    """A veth pair inside the node's namespace: `fab0` is the node's fabric port, its
    peer the far side (so the pair goes when the namespace does)."""
    ip("-n", namespace, "link", "add", LINK, "type", "veth", "peer", "name", f"{LINK}p")
    ip("-n", namespace, "link", "set", f"{LINK}p", "up")
    ip("-n", namespace, "link", "set", LINK, "up")


@contextlib.asynccontextmanager
async def fabric_cluster(
    tmp: Path, database_url: str, db: asyncpg.Connection, count: int
) -> AsyncIterator[tuple[Cluster, netns.TestBed, str]]:
    defs = nodes(count, gpus=1)
    bed = netns.TestBed()
    nats: embedded.Server | None = None
    cluster: Cluster | None = None
    try:
        hosts = await asyncio.to_thread(bed.create, [d.name for d in defs])
        for host in hosts.values():
            await asyncio.to_thread(add_fabric_link, host.namespace)
        nats = await asyncio.to_thread(embedded.start_nats, tmp / "nats", host=bed.control_address)
        cluster = make_cluster(tmp / "state", nats.url, database_url)
        cluster.start_services()
        for d in defs:
            host = hosts[d.name]
            extra = {"MUSTER_NODE_ADDRESS": host.address, **FABRIC_ENV}
            cluster.start_node(d, prefix=host.exec_prefix(), **extra)
        await nodes_up(db, count, timeout=60)
        yield cluster, bed, nats.url
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop_all, 10)
        if nats is not None:
            await asyncio.to_thread(nats.stop)
        await asyncio.to_thread(bed.destroy)


async def run_row(db: asyncpg.Connection, job_id: int) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT state, nodes, restart_count FROM job_runs WHERE job_id = $1", job_id
    )
    assert row is not None
    return row


async def node_state(db: asyncpg.Connection, node: str) -> str | None:
    state: str | None = await db.fetchval("SELECT state FROM nodes WHERE name = $1", node)
    return state


async def test_a_fabric_link_down_shrinks_the_elastic_job_and_the_node_returns_once_stable(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    async with fabric_cluster(tmp_path, database_url, db, 3) as (_cluster, bed, url):
        reply = await submit(url, ELASTIC, ("--nodes=2:3", "--gpus-per-node=1"), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
        victim = (await run_row(db, job_id))["nodes"][-1]

        await asyncio.to_thread(ip, "-n", bed.hosts[victim].namespace, "link", "set", LINK, "down")

        row = await eventually(
            lambda: run_row(db, job_id),
            lambda r: r["restart_count"] == 1 and r["state"] == "RUNNING",
            60,
            "the job running again on the survivors",
        )
        assert victim not in row["nodes"] and len(row["nodes"]) == 2
        assert await node_state(db, victim) in ("DRAINING", "DRAINED")
        view = await call(url, "nodes", QueueRequest(user="root"), NodesReply)
        [shown] = [n for n in view.nodes if n.name == victim]
        assert shown.last_fault is not None and shown.last_fault["link"] == LINK
        assert shown.last_fault["class"] == "network_link_down"
        assert LINK in shown.reason
        show = await call(url, "show", ShowJobRequest(user="root", job_id=job_id), ShowJobReply)
        assert any(f"on {LINK}" in a.reason for a in show.attempts), show.attempts

        # Up again: the node returns once the link has been stable for MUSTER_FABRIC_STABLE_S.
        await asyncio.to_thread(ip, "-n", bed.hosts[victim].namespace, "link", "set", LINK, "up")
        await eventually(lambda: node_state(db, victim), lambda s: s == "UP", 60, "back UP")
        assert (await run_row(db, job_id))["restart_count"] == 1
