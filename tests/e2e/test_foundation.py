"""End to end, on real NATS, PostgreSQL and processes: one path through all five
services, the fault flow, a killed placer, a poison message and bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats
import pytest

from muster.cluster import Cluster
from shared.bus import Bus
from tests.support.cluster import (
    eventually,
    inject,
    job_state,
    kill9,
    nodes,
    run_cli,
    running_cluster,
    settled_usage,
    submit,
)

pytestmark = pytest.mark.slow

ENV_SCRIPT = """#!/bin/bash
#SBATCH --job-name=envcheck
echo "node=$MUSTER_NODE job=$MUSTER_JOB_ID rank=$RANK node_rank=$NODE_RANK world=$WORLD_SIZE \
nnodes=$NNODES local=$LOCAL_WORLD_SIZE cuda=$CUDA_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT"
sleep 0.5
"""


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(4)) as c:
        yield c


async def test_a_two_node_job_runs_real_workers_with_the_right_environment(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    env = {"MUSTER_NATS_URL": cluster.nats_url, "CWD": str(tmp_path)}
    script = tmp_path / "env.sh"
    script.write_text(ENV_SCRIPT)
    out = run_cli(
        "submit", "--nodes", "2", "--gpus-per-node", "2", "--time", "5", str(script), env=env
    )
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.split()[-1])

    await eventually(
        lambda: job_state(db, job_id), lambda s: s == "COMPLETED", what="job completes"
    )

    lines = sorted((tmp_path / f"slurm-{job_id}.out").read_text().splitlines())
    assert len(lines) == 2
    fields = [dict(kv.split("=", 1) for kv in line.split()) for line in lines]
    assert {f["node"] for f in fields} == {f["node"] for f in fields} and len(
        {f["node"] for f in fields}
    ) == 2
    assert sorted(f["rank"] for f in fields) == ["0", "1"]
    assert all(f["world"] == "2" and f["nnodes"] == "2" and f["job"] == str(job_id) for f in fields)
    assert all(len(f["cuda"].split(",")) == 2 for f in fields)
    assert len({f["master"] for f in fields}) == 1
    charged = await settled_usage(db, job_id)
    used = await db.fetchval("SELECT gpu_seconds FROM job_runs WHERE job_id = $1", job_id)
    assert charged == pytest.approx(used)  # what the launcher measured, charged once


ELASTIC = """#!/bin/bash
echo "start node=$MUSTER_NODE world=$WORLD_SIZE restart=$MUSTER_RESTART_COUNT"
sleep 60
"""


async def test_xid_79_shrinks_an_elastic_job_onto_the_survivors(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    reply = await submit(
        cluster.nats_url, ELASTIC, ("--nodes=2:3", "--gpus-per-node=4"), workdir=str(tmp_path)
    )
    job_id = reply.job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", what="running")
    victim = (await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id))[0]

    await inject(cluster.nats_url, victim, 79)

    row = await eventually(
        lambda: db.fetchrow(
            "SELECT state, nodes, restart_count FROM job_runs WHERE job_id = $1", job_id
        ),
        lambda r: r is not None and r["restart_count"] == 1 and r["state"] == "RUNNING",
        what="restart on survivors",
    )
    assert row is not None
    assert victim not in row["nodes"] and len(row["nodes"]) == 2
    assert await db.fetchval("SELECT state FROM nodes WHERE name = $1", victim) == "FAILED"
    out = tmp_path / f"slurm-{job_id}.out"
    await eventually(
        lambda: asyncio.to_thread(out.read_text), lambda t: t.count("restart=1") == 2, what="log"
    )
    assert out.read_text().count("world=2 restart=1") == 2

    # No new job lands on the faulty node: fill the cluster and look.
    more = await submit(
        cluster.nats_url, "#!/bin/bash\nsleep 30\n", ("--gpus-per-node=4", "--array=0-3")
    )
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM job_runs WHERE state = 'RUNNING'"),
        lambda n: n >= 2,
        what="new jobs running",
    )
    await asyncio.sleep(1.5)
    held = await db.fetch(
        "SELECT DISTINCT node FROM allocation_gpus WHERE live AND node = $1", victim
    )
    assert held == []
    assert len(more.job_ids) == 4


async def test_a_placer_killed_with_sigkill_loses_no_job_and_double_books_no_gpu(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    kill9(cluster, "placer")
    ids: list[int] = []
    for _ in range(20):
        reply = await submit(cluster.nats_url, "#!/bin/bash\nsleep 0.3\n", ("--gpus-per-node=2",))
        ids += reply.job_ids
    cluster.spawn("placer", "services.placer")
    await asyncio.sleep(1.0)
    kill9(cluster, "placer")  # again, mid-run
    cluster.spawn("placer", "services.placer")

    states = await eventually(
        lambda: db.fetch(
            "SELECT job_id, state FROM job_runs WHERE job_id = ANY($1::bigint[])", ids
        ),
        lambda rows: len(rows) == 20 and all(r["state"] == "COMPLETED" for r in rows),
        timeout=90,
        what="all 20 jobs complete",
    )
    assert len(states) == 20
    runs = await db.fetch(
        "SELECT job_id, count(*) AS n FROM allocations"
        " WHERE job_id = ANY($1::bigint[]) GROUP BY job_id",
        ids,
    )
    assert all(r["n"] == 1 for r in runs)  # each ran once
    overlaps = await db.fetchval(
        "SELECT count(*) FROM allocation_gpus a JOIN allocation_gpus b"
        " ON a.node = b.node AND a.gpu = b.gpu AND a.alloc_id < b.alloc_id"
        " JOIN allocations x ON x.alloc_id = a.alloc_id"
        " JOIN allocations y ON y.alloc_id = b.alloc_id"
        " WHERE tstzrange(x.created_at, coalesce(x.released_at, 'infinity'))"
        "    && tstzrange(y.created_at, coalesce(y.released_at, 'infinity'))"
    )
    assert overlaps == 0


async def test_a_poison_message_is_dead_lettered_and_the_service_keeps_working(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    nc = await nats.connect(cluster.nats_url)
    js = nc.jetstream()
    await js.publish("muster.job.submitted", b"{not json", headers={"Nats-Msg-Id": "poison-1"})
    await js.publish(
        "muster.job.submitted",
        b'{"type":"job.submitted","job_id":"x"}',
        headers={"Nats-Msg-Id": "poison-2"},
    )
    await nc.close()
    bus = await Bus.connect(cluster.nats_url, name="test-dlq")
    try:
        dead = await eventually(
            lambda: _dead_letters(bus, "placer"), lambda d: len(d) >= 2, what="dead letters"
        )
    finally:
        await bus.close()
    assert [payload for payload, _ in dead] == [
        b"{not json",
        b'{"type":"job.submitted","job_id":"x"}',
    ]
    assert all(h["Muster-Original-Subject"] == "muster.job.submitted" for _, h in dead)
    assert all(h["Muster-Error"].startswith("undecodable") for _, h in dead)
    reply = await submit(cluster.nats_url, "#!/bin/bash\ntrue\n", ())
    await eventually(
        lambda: job_state(db, reply.job_ids[0]), lambda s: s == "COMPLETED", what="job"
    )


async def _dead_letters(bus: Bus, consumer: str) -> list[tuple[bytes, dict[str, str]]]:
    return [letter async for letter in bus.dead_letters(consumer)]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--gpus-per-node=-1",), "gpus"),
        (("--frobnicate",), "frobnicate"),
        (("--gpus-per-node=9",), "largest node has 4"),
    ],
    ids=["a negative GPU count", "an unknown option", "9 GPUs per node on 4-GPU nodes"],
)
async def test_bad_input_gets_a_clear_error_and_nothing_is_persisted(
    cluster: Cluster, db: asyncpg.Connection, argv: tuple[str, ...], says: str
) -> None:
    from muster.client import ApiRefused

    with pytest.raises(ApiRefused) as refused:
        await submit(cluster.nats_url, "#!/bin/bash\ntrue\n", argv)
    assert says in str(refused.value)
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0
    # what the job would owe; node.cleaned answers to the nodes registering are not its
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE subject LIKE 'muster.job.%'") == 0
