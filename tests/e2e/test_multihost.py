"""Over a real network: every node agent in its own network namespace, with its own
address, the control plane (NATS, PostgreSQL, the services) in the root namespace.

What these check is what crosses a network on a real cluster: agents register the
address their node has; a gang's workers run in their own node's namespace and find the
rendezvous at the first node's address, on a port free on that node; a real PyTorch
(gloo) job shrinks across the hosts after an XID; and a partition (the node's link taken
down) fences the old attempt on the partitioned node before the job runs elsewhere.
The test bed is tests/support/netns.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster, NodeDef
from shared import embedded
from tests.support import netns
from tests.support.cluster import (
    eventually,
    inject,
    job_state,
    make_cluster,
    nodes,
    nodes_up,
    pid_from,
    submit,
)

WHY_NOT = netns.available()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_elastic.py"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-")]


@dataclass
class MultiHost:
    cluster: Cluster
    bed: netns.TestBed
    url: str


@contextlib.asynccontextmanager
async def multihost(
    tmp: Path, database_url: str, db: asyncpg.Connection, defs: list[NodeDef]
) -> AsyncIterator[MultiHost]:
    """NATS on the control plane's own address, services beside it, one agent per
    namespace; everything stopped and removed on the way out."""
    bed = netns.TestBed()
    nats: embedded.Server | None = None
    cluster: Cluster | None = None
    try:
        hosts = await asyncio.to_thread(bed.create, [d.name for d in defs])
        nats = await asyncio.to_thread(embedded.start_nats, tmp / "nats", host=bed.control_address)
        cluster = make_cluster(tmp / "state", nats.url, database_url)
        cluster.start_services()
        for d in defs:
            host = hosts[d.name]
            cluster.start_node(d, prefix=host.exec_prefix(), MUSTER_NODE_ADDRESS=host.address)
        await nodes_up(db, len(defs))
        yield MultiHost(cluster, bed, nats.url)
    finally:
        if cluster is not None:
            await asyncio.to_thread(cluster.stop_all, 10)
        if nats is not None:
            await asyncio.to_thread(nats.stop)
        await asyncio.to_thread(bed.destroy)


def net_namespace_of(prefix: list[str]) -> str:
    done = subprocess.run([*prefix, "readlink", "/proc/self/ns/net"], capture_output=True)
    return done.stdout.decode().strip()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def run_nodes(db: asyncpg.Connection, job_id: int) -> list[str]:
    names = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    return list(names or [])


async def test_a_gang_runs_in_its_nodes_namespaces_and_meets_at_the_first_nodes_address(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    async with multihost(tmp_path, database_url, db, nodes(3, gpus=1)) as mh:
        rows = await db.fetch("SELECT name, address FROM nodes")
        registered = {r["name"]: r["address"] for r in rows}
        assert registered == {n: h.address for n, h in mh.bed.hosts.items()}

        script = '#!/bin/bash\necho "$MUSTER_NODE $(readlink /proc/self/ns/net) $MASTER_ADDR"\n'
        reply = await submit(mh.url, script, ("--nodes=2", "--gpus-per-node=1"), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 60, "done")

        ran = await run_nodes(db, job_id)
        out = read(tmp_path / f"slurm-{job_id}.out").split("\n")
        seen = {line.split()[0]: line.split()[1:] for line in out if line.strip()}
        assert sorted(seen) == sorted(ran)
        first = mh.bed.hosts[ran[0]].address
        for node, (namespace, master) in seen.items():
            assert namespace == net_namespace_of(mh.bed.hosts[node].exec_prefix())
            assert master == first


async def test_a_torch_job_shrinks_across_hosts_after_an_xid_79(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    pytest.importorskip("torch", reason="scripts/test installs torch==2.13.0 (CPU)")
    async with multihost(tmp_path, database_url, db, nodes(3, gpus=1)) as mh:
        ckpt = tmp_path / "ckpt"
        argv = (
            "--torchrun", "--nodes=2:3", "--gpus-per-node=1", "--time=10", "--job-name=train",
            f"--export=ALL,GLOO_SOCKET_IFNAME={netns.IFACE}",
        )  # fmt: skip
        args = ("--steps", "40", "--ckpt-every", "5", "--ckpt-dir", str(ckpt), "--sleep", "0.25")
        reply = await submit(
            mh.url, EXAMPLE.read_text(), argv, str(tmp_path), args=args, script_path=str(EXAMPLE)
        )
        job_id = reply.job_ids[0]
        log = tmp_path / f"slurm-{job_id}.out"
        await eventually(
            lambda: asyncio.to_thread(read, log), lambda t: "step=8 world_size=3" in t, 120, "3"
        )
        victim = (await run_nodes(db, job_id))[-1]
        await inject(mh.url, victim, 79)

        await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 180, "done")
        text = log.read_text()
        steps2 = [int(m) for m in re.findall(r"step=(\d+) world_size=2 rank=0", text)]
        resumed = [int(m) for m in re.findall(r"resumed_from=(\d+)", text)]
        assert steps2 and resumed and resumed[-1] > 0, text[-2000:]
        assert min(steps2) == resumed[-1] + 1 and max(steps2) == 40
        assert victim not in await run_nodes(db, job_id)


async def test_a_partitioned_node_fences_its_job_before_the_job_runs_elsewhere(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    async with multihost(tmp_path, database_url, db, nodes(2, gpus=1)) as mh:
        pids = tmp_path / "pids"
        pids.mkdir()
        script = (
            f'#!/bin/bash\necho $$ > {pids}/"$MUSTER_NODE-$MUSTER_RESTART_COUNT"\nexec sleep 600\n'
        )
        reply = await submit(mh.url, script, ("--gpus-per-node=1",), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 30, "running")
        (first,) = await run_nodes(db, job_id)
        old_file = await eventually(
            lambda: asyncio.to_thread(lambda: sorted(pids.iterdir())), bool, 20, "pid file"
        )
        old_pid = await pid_from(old_file[0], 20)
        assert alive(old_pid)

        await asyncio.to_thread(mh.bed.partition, first)
        moved = await eventually(
            lambda: run_nodes(db, job_id), lambda ns: bool(ns) and first not in ns, 60, "moved"
        )
        # The new attempt is placed only after the node is DOWN, which is after the fence:
        # the old worker must already be gone (0 s of overlap), checked on the machine.
        assert not alive(old_pid), "the partitioned node's worker outlived its fence"
        await eventually(
            lambda: asyncio.to_thread(lambda: len(list(pids.iterdir()))),
            lambda n: n >= 2,
            30,
            "second attempt started",
        )

        await asyncio.to_thread(mh.bed.heal, first)
        await eventually(
            lambda: db.fetchval("SELECT state FROM nodes WHERE name = $1", first),
            lambda s: s == "UP",
            60,
            "partitioned node back",
        )
        assert not alive(old_pid)
        assert await run_nodes(db, job_id) == moved
        assert await job_state(db, job_id) == "RUNNING"
