"""Chaos: every service is SIGKILLed and restarted while jobs flow. Afterwards every
accepted job has completed exactly once, no GPU was ever held by two live allocations,
and usage was charged exactly once (invariants 1, 2 and 6 of the design brief)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import SERVICES, Cluster
from tests.support.cluster import (
    eventually,
    kill9,
    nodes,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

JOB = "#!/bin/bash\nsleep 1.5\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(3)) as c:
        yield c


async def test_killing_each_service_mid_run_loses_and_repeats_nothing(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    ids: list[int] = []
    for _ in range(3):
        reply = await submit(cluster.nats_url, JOB, ("--gpus-per-node=2", "--array=0-4"))
        ids += reply.job_ids
    for service in (*SERVICES, "launcher", "placer"):
        await asyncio.sleep(1.0)
        kill9(cluster, service)
        await asyncio.sleep(0.5)
        cluster.spawn(service, f"services.{service}")

    rows = await eventually(
        lambda: db.fetch(
            "SELECT job_id, state FROM job_runs WHERE job_id = ANY($1::bigint[])", ids
        ),
        lambda rs: len(rs) == len(ids) and all(r["state"] == "COMPLETED" for r in rs),
        timeout=120,
        what=f"all {len(ids)} jobs complete",
    )
    assert len(rows) == 15
    runs = await db.fetch(
        "SELECT job_id, count(*) AS n FROM attempts WHERE job_id = ANY($1::bigint[])"
        " GROUP BY job_id",
        ids,
    )
    assert {r["job_id"]: r["n"] for r in runs} == dict.fromkeys(ids, 1)  # each ran once
    overlaps = await db.fetchval(
        "SELECT count(*) FROM allocation_gpus a JOIN allocation_gpus b"
        " ON a.node = b.node AND a.gpu = b.gpu AND a.alloc_id < b.alloc_id"
        " JOIN allocations x ON x.alloc_id = a.alloc_id"
        " JOIN allocations y ON y.alloc_id = b.alloc_id"
        " WHERE tstzrange(x.created_at, coalesce(x.released_at, 'infinity'))"
        "    && tstzrange(y.created_at, coalesce(y.released_at, 'infinity'))"
    )
    assert overlaps == 0
    used = await db.fetchval(
        "SELECT sum(gpu_seconds) FROM job_runs WHERE job_id = ANY($1::bigint[])", ids
    )
    charged = await eventually(
        lambda: db.fetchval("SELECT coalesce(sum(gpu_seconds), 0) FROM usage"),
        lambda v: v == pytest.approx(used),
        timeout=30,
        what="usage charged once",
    )
    assert charged == pytest.approx(used)
