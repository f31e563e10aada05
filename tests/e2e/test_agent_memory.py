"""End to end on a running local cluster: what a node agent was told, or already ran,
outlives the agent being SIGKILLed and restarted (services/launcher/kept.py).

A start whose stop came first (a start delayed on the bus, or queued behind a slow
prolog, while the launcher cancelled its job) and a start asked again after its
generation ran (a new launcher owner resuming one it cannot know finished) must start
nothing. Before, the agent kept both in memory only: killed and restarted in between,
it ran the job's script anyway (the second time, twice). Each start's script appends a
line to a file of its own, and every check reads that file and `/proc`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import msgspec
import pytest

from muster.client import agent
from muster.cluster import Cluster
from services.launcher.gang import launcher_signer
from services.launcher.worker_table import WorkerTable, node_state_folder
from shared.agent_auth import GrantSigner
from shared.api import AgentReply, StatusRequest, StopWorkers, WorkerSpec
from tests.support.cluster import eventually, kill9, nodes, open_folder, running_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent's run-as and spool need root"),
]

JOB = 990_101  # no such job in the database: only these requests run or stop it


@pytest.fixture
async def cluster(
    nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    with open_folder("muster-kept-", 0o755) as state:  # the job's user reaches the spool
        async with running_cluster(state, nats_url, database_url, db, nodes(1)) as c:
            yield c


@pytest.fixture
def workdir() -> Iterator[Path]:
    with open_folder("muster-kept-work-", 0o777) as folder:
        yield folder


def start_of(workdir: Path, tag: str, generation: int) -> WorkerSpec:
    script = f"#!/bin/bash\necho ran >> {workdir}/ran-{tag}\n"
    return WorkerSpec(
        job_id=JOB, attempt=1, generation=generation, argv=("{spool}/script.sh",),
        env={"PATH": "/usr/bin:/bin"}, workdir=str(workdir), stdout=f"{workdir}/out-{tag}",
        stderr=f"{workdir}/out-{tag}", run_as="root", script=script,
    )  # fmt: skip


async def send(cluster: Cluster, verb: str, body: msgspec.Struct) -> AgentReply:
    node = cluster.nodes[0]
    raw = await agent(cluster.nats_url, node, verb, body, timeout=30)
    return msgspec.json.decode(raw, type=AgentReply)


async def restart_agent(cluster: Cluster) -> None:
    """kill -9 of the node's agent, a new one started, and served once it answers."""
    [node] = nodes(1)
    kill9(cluster, f"node-{node.name}")
    cluster.start_node(node)

    async def status() -> AgentReply | None:
        try:
            return await send(cluster, "status", StatusRequest())
        except Exception:  # not serving yet (no responders, or a timeout)
            return None

    await eventually(status, lambda r: r is not None, 60, "the restarted agent answering")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def signer(cluster: Cluster) -> GrantSigner:
    found = launcher_signer(str(cluster.state_dir))
    assert found is not None
    return found


async def test_a_stop_that_came_before_its_start_holds_across_an_agent_restart(
    cluster: Cluster, workdir: Path
) -> None:
    launcher, node = signer(cluster), cluster.nodes[0]
    stop = StopWorkers(job_id=JOB, grace_s=1.0, attempt=1, generation=0)
    reply = await send(cluster, "stop", launcher.sign(stop, node, now=time.time()))
    assert reply.ok and reply.message == "not running", reply
    await restart_agent(cluster)
    start = launcher.sign(start_of(workdir, "stopped", 0), node, now=time.time())
    reply = await send(cluster, "start", start)
    assert reply.ok and reply.message == "stopped before it started", reply
    await asyncio.sleep(1.0)  # what a start would have run by now
    assert lines(workdir / "ran-stopped") == []
    table = WorkerTable(node_state_folder(cluster.state_dir, node))
    assert [r for r in table.records() if r.job_id == JOB] == []


async def test_a_generation_that_ran_is_not_run_again_by_the_next_agent(
    cluster: Cluster, workdir: Path
) -> None:
    launcher, node = signer(cluster), cluster.nodes[0]
    start = launcher.sign(start_of(workdir, "twice", 0), node, now=time.time())
    reply = await send(cluster, "start", start)
    assert reply.ok, reply
    table = WorkerTable(node_state_folder(cluster.state_dir, node))
    await eventually(
        lambda: asyncio.to_thread(lambda: [r for r in table.records() if r.job_id == JOB]),
        lambda left: left == [],
        30,
        "the run's exit reported and its record gone",
    )
    assert lines(workdir / "ran-twice") == ["ran"]
    await restart_agent(cluster)
    again = launcher.sign(start_of(workdir, "twice", 0), node, now=time.time())
    reply = await send(cluster, "start", again)
    assert reply.ok and reply.message == "already ran", reply
    await asyncio.sleep(1.0)
    assert lines(workdir / "ran-twice") == ["ran"]
