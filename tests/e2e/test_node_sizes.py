"""End to end: nodes announce their CPUs and memory (here set smaller than the machine,
as MUSTER_CPUS and MUSTER_MEMORY_MIB do for a simulated node); a job asking more memory
or CPUs per node than a node has runs on one that has them; a job no node is big enough
for is refused at submission, naming the largest node; sinfo shows the sizes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.client import ApiRefused, call
from muster.cluster import Cluster
from shared.api import JobView, NodesReply, QueueRequest
from tests.support.cluster import eventually, job_state, local_config_cluster, queue, submit

pytestmark = pytest.mark.slow

SIZES = {
    "node01": {"MUSTER_CPUS": "4", "MUSTER_MEMORY_MIB": "8192"},
    "node02": {"MUSTER_CPUS": "32", "MUSTER_MEMORY_MIB": "65536"},
}


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with local_config_cluster(tmp_path / "state", nats_url, database_url, db, 2, SIZES) as c:
        yield c


async def test_a_job_runs_only_on_a_node_big_enough_for_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    url = cluster.nats_url
    shown = await call(url, "nodes", QueueRequest(user="root"), NodesReply)
    assert {n.name: (n.cpus, n.memory_mib) for n in shown.nodes} == {
        "node01": (4, 8192), "node02": (32, 65536)
    }  # fmt: skip
    # node01 is first and free; the job needs node02's memory and CPUs
    job = (await submit(url, "#!/bin/bash\nsleep 3\n", ("--mem=16G", "-c", "8"))).job_ids[0]
    held = await eventually(  # sinfo's %C, scontrol's CPUAlloc=: what the job asked
        lambda: call(url, "nodes", QueueRequest(user="root"), NodesReply),
        lambda r: any(n.cpus_alloc for n in r.nodes),
        60,
        "the job's CPUs on its node",
    )
    assert {n.name: n.cpus_alloc for n in held.nodes} == {"node01": 0, "node02": 8}
    await eventually(partial(job_state, db, job), lambda s: s == "COMPLETED", 60, f"{job}")
    ran_on = await db.fetchval(
        "SELECT array_agg(n.node) FROM allocations a JOIN allocation_nodes n USING (alloc_id)"
        " WHERE a.job_id = $1",
        job,
    )
    assert ran_on == ["node02"]
    with pytest.raises(ApiRefused) as refused:
        await submit(url, "#!/bin/bash\ntrue\n", ("--mem=100G",))
    assert "its largest has 65536 MiB" in str(refused.value), str(refused.value)


async def test_memory_a_running_job_holds_is_not_given_twice(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """node02 (64 GiB) has GPUs free beside a job holding 40 GiB, but not 40 GiB more:
    the second job waits, saying so, and starts there once the first has ended."""
    url = cluster.nats_url
    script = "#!/bin/bash\nsleep 5\n"
    first = (await submit(url, script, ("--mem=40G",))).job_ids[0]
    await eventually(partial(job_state, db, first), lambda s: s == "RUNNING", 60, f"{first}")
    shown = await call(url, "nodes", QueueRequest(user="root"), NodesReply)  # AllocMem=
    assert {n.name: n.mem_alloc_mib for n in shown.nodes} == {"node01": 0, "node02": 40960}
    second = (await submit(url, "#!/bin/bash\ntrue\n", ("--mem=40G",))).job_ids[0]
    waiting = await wait_of(url, second)
    assert (waiting.state, waiting.reason) == ("PENDING", "RESOURCES"), waiting
    assert "40960 MiB of free memory on node02" in waiting.detail, waiting
    await eventually(partial(job_state, db, second), lambda s: s == "COMPLETED", 60, f"{second}")
    # it started once the first had ended, on the node whose memory that freed
    order = await db.fetchrow(
        "SELECT (SELECT ended_at FROM job_runs WHERE job_id = $1) AS ended,"
        " (SELECT started_at FROM job_runs WHERE job_id = $2) AS started,"
        " (SELECT array_agg(n.node) FROM allocations a JOIN allocation_nodes n USING (alloc_id)"
        "   WHERE a.job_id = $2) AS nodes",
        first,
        second,
    )
    assert order is not None
    assert order["started"] >= order["ended"], dict(order)
    assert order["nodes"] == ["node02"]


async def test_mem_0_holds_all_of_its_nodes_memory(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """`--mem=0` (Slurm's all of the node's memory) on node02: it holds 64 GiB there
    (AllocMem=), and a job asking 1 GiB that only node02 can take waits for it."""
    url = cluster.nats_url
    whole = (await submit(url, "#!/bin/bash\nsleep 4\n", ("--mem=0", "-w", "node02"))).job_ids[0]
    await eventually(partial(job_state, db, whole), lambda s: s == "RUNNING", 60, f"{whole}")
    shown = await call(url, "nodes", QueueRequest(user="root"), NodesReply)
    assert {n.name: n.mem_alloc_mib for n in shown.nodes} == {"node01": 0, "node02": 65536}
    small = (await submit(url, "#!/bin/bash\ntrue\n", ("--mem=1G", "-c", "8"))).job_ids[0]
    waiting = await wait_of(url, small)
    assert "1024 MiB of free memory on node02" in waiting.detail, waiting
    await eventually(partial(job_state, db, small), lambda s: s == "COMPLETED", 60, f"{small}")


async def wait_of(url: str, job: int) -> JobView:
    """The job as the queue shows it once its wait says why (its detail)."""
    view = await eventually(
        lambda: queue(url),
        lambda r: any(j.job_id == job and j.detail for j in r.jobs),
        30,
        f"job {job}'s wait",
    )
    (found,) = [j for j in view.jobs if j.job_id == job]
    return found
