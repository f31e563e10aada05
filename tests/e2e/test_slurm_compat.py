"""End to end, on a local cluster of real processes: Slurm users' GPU type names and
node features. Nodes announce NVML model names ("NVIDIA H100 80GB HBM3") and features
from their topology; the config's node sets add more. `--gres=gpu:h100:N` and
`--constraint` expressions (feature counts too) are admitted, placed on the nodes they
name, and shown by `muster nodes`; a typo in a partition list is refused naming it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.client import ApiRefused, call
from muster.cluster import Cluster, NodeDef
from shared.api import NodesReply, QueueRequest
from tests.support.cluster import eventually, job_state, running_cluster, submit

pytestmark = pytest.mark.slow

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"
NODES = [
    NodeDef("node01", 4, H100, ("spine0", "leaf1"), ("ib", "rack1")),
    NodeDef("node02", 4, A100, ("spine0", "leaf2"), ("ib", "rack2")),
    NodeDef("node03", 4, H100, ("spine0", "leaf2"), ("rack2",)),
]
CONFIG = """
[cluster]
default_partition = "normal"

[node_sets]
all = "node[01-03]"
big = { nodes = "node03", features = ["bigmem"] }

[partitions.normal]
nodes = ["all"]
default_time = "10:00"

[partitions.debug]
nodes = ["all"]
default_time = "10:00"

[roles]
operators = ["root"]
"""
SLEEP = "#!/bin/bash\nsleep 300\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    config = tmp_path / "cluster.toml"
    config.write_text(CONFIG)
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        NODES,
        env={"MUSTER_CLUSTER_CONFIG": str(config)},
    ) as c:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM node_policy"), lambda n: n == 1, 30, "policy"
        )
        yield c


async def _placed(db: asyncpg.Connection, job_id: int) -> list[str]:
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, f"{job_id} runs")
    rows = await db.fetch(
        "SELECT n.node FROM allocation_nodes n JOIN allocations a USING (alloc_id)"
        " WHERE a.job_id = $1 AND a.released_at IS NULL ORDER BY n.node",
        job_id,
    )
    return [r["node"] for r in rows]


async def test_typed_gpus_and_constraints_place_on_the_nodes_they_name(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    url = cluster.nats_url
    asks = {
        "typed GPUs on a rack": ("--gres=gpu:h100:2", "-C", "rack2"),
        "an A100 by type, any case": ("--gpus-per-node=A100:1",),
        "an AND, an OR and a config feature": ("-C", "ib&rack1|bigmem", "-N", "2", "-G", "2"),
        "a matching OR: the rack that holds two nodes": ("-C", "[rack1|rack2]", "-N", "2"),
        # leaf2 alone would hold two nodes, but only one of them has ib
        "a count: two nodes with ib": ("-C", "ib*2", "-N", "2"),
    }
    ids = {name: (await submit(url, SLEEP, argv)).job_ids[0] for name, argv in asks.items()}
    placed = {name: await _placed(db, job_id) for name, job_id in ids.items()}
    assert placed == {
        "typed GPUs on a rack": ["node03"],
        "an A100 by type, any case": ["node02"],
        "an AND, an OR and a config feature": ["node01", "node03"],
        "a matching OR: the rack that holds two nodes": ["node02", "node03"],
        "a count: two nodes with ib": ["node01", "node02"],
    }

    view = await call(url, "nodes", QueueRequest(user="root"), NodesReply)
    shown = {n.name: (n.gpu_type, n.features) for n in view.nodes}
    declared = {
        "node01": ("h100", ("ib", "rack1")),
        "node02": ("a100", ("ib", "rack2")),
        "node03": ("h100", ("rack2", "bigmem")),
    }
    for name, (kind, features) in declared.items():  # an agent may find more (a runtime)
        assert shown[name][0] == kind
        assert [f for f in shown[name][1] if f in features] == list(features)

    with pytest.raises(ApiRefused) as typo:
        await submit(url, SLEEP, ("-p", "normal,nosuch"))
    assert "partition list 'normal,nosuch': no partition 'nosuch'" in str(typo.value)
    with pytest.raises(ApiRefused) as untyped:
        await submit(url, SLEEP, ("--gres=gpu:b200:1",))
    assert "GPU types there: a100 (NVIDIA A100-SXM4-80GB), h100 (NVIDIA H100 80GB HBM3)" in str(
        untyped.value
    )
