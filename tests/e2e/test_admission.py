"""End to end on a local cluster (every service and node agent a process) with the local
cluster's configuration: array jobs with a throttle, dependencies (aftercorr's task by
task too), approval."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.cluster import Cluster
from shared.api import JobSelector, Ok, ShowJobReply, ShowJobRequest
from tests.support.cluster import eventually, job_state, local_config_cluster, submit

pytestmark = pytest.mark.slow

QUICK = "#!/bin/bash\nsleep 1\n"
FAILS = "#!/bin/bash\nexit 3\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with local_config_cluster(tmp_path / "state", nats_url, database_url, db, 4) as c:
        yield c


async def test_an_array_with_a_throttle_runs_every_task_never_more_than_k_at_once(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    reply = await submit(
        cluster.nats_url, QUICK, ("--array=0-5%2", "--gpus-per-node=1"), user="root"
    )
    ids = list(reply.job_ids)
    assert len(ids) == 6
    peak = 0
    for _ in range(300):
        live = await db.fetchval(
            "SELECT count(*) FROM allocations WHERE released_at IS NULL"
            " AND job_id = ANY($1::bigint[])",
            ids,
        )
        peak = max(peak, live)
        done = await db.fetchval(
            "SELECT count(*) FROM job_runs WHERE state = 'COMPLETED'"
            " AND job_id = ANY($1::bigint[])",
            ids,
        )
        if done == 6:
            break
        await asyncio.sleep(0.1)
    assert done == 6
    assert peak == 2


async def test_dependencies_order_jobs_and_an_unmeetable_one_says_so(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    url = cluster.nats_url
    first = (await submit(url, QUICK, (), user="root")).job_ids[0]
    bad = (await submit(url, FAILS, (), user="root")).job_ids[0]
    after_ok = (await submit(url, QUICK, (f"-d afterok:{first}",), user="root")).job_ids[0]
    after_any = (await submit(url, QUICK, (f"--dependency=afterany:{bad}",), user="root")).job_ids[
        0
    ]
    either = (
        await submit(url, QUICK, (f"-d afterok:{bad}?afterok:{first}",), user="root")
    ).job_ids[0]
    never = (await submit(url, QUICK, (f"-d afterok:{bad}",), user="root")).job_ids[0]

    for job in (after_ok, after_any, either):
        await eventually(partial(job_state, db, job), lambda s: s == "COMPLETED", 60, f"{job}")
    order = await db.fetchrow(
        "SELECT (SELECT ended_at FROM job_runs WHERE job_id = $1) AS a_end,"
        " (SELECT started_at FROM job_runs WHERE job_id = $2) AS b_start",
        first,
        after_ok,
    )
    assert order is not None
    assert order["b_start"] >= order["a_end"]

    show = await eventually(
        lambda: call(url, "show", ShowJobRequest(user="root", job_id=never), ShowJobReply),
        lambda r: "DependencyNeverSatisfied" in r.job.detail,
        30,
        "never-satisfied reason",
    )
    assert show.job.state == "PENDING" and show.why_pending.startswith("DEPENDENCY")
    assert await job_state(db, never) is None  # never started


# shard 0 is quick, shard 1 fails, shard 2 is slow
SHARDS = """#!/bin/bash
case $SLURM_ARRAY_TASK_ID in
  0) sleep 0.5 ;;
  1) exit 3 ;;
  *) sleep 12 ;;
esac
"""


async def test_aftercorr_starts_each_task_when_its_own_counterpart_completes(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """`-d aftercorr:A`: task T waits for A's task T alone. Task 0 runs while A's slow
    task 2 still runs; task 1 (its counterpart failed) never starts; task 3 (A has no
    task 3) starts at once; task 2 starts after A's task 2 ends."""
    url = cluster.nats_url
    first = list((await submit(url, SHARDS, ("--array=0-2",), user="root")).job_ids)
    then = list(
        (await submit(url, QUICK, ("--array=0-3", f"-d aftercorr:{first[0]}"), user="root")).job_ids
    )
    for job in (then[0], then[2], then[3]):
        await eventually(partial(job_state, db, job), lambda s: s == "COMPLETED", 90, f"{job}")
    runs = {
        r["job_id"]: r
        for r in await db.fetch(
            "SELECT job_id, started_at, ended_at FROM job_runs WHERE job_id = ANY($1::bigint[])",
            first + then,
        )
    }
    assert runs[then[0]]["ended_at"] < runs[first[2]]["ended_at"]  # did not wait for shard 2
    assert runs[then[3]]["started_at"] < runs[first[2]]["ended_at"]  # nothing to wait for
    assert runs[then[2]]["started_at"] >= runs[first[2]]["ended_at"]
    assert then[1] not in runs  # its counterpart failed: never started
    show = await call(url, "show", ShowJobRequest(user="root", job_id=then[1]), ShowJobReply)
    assert show.job.state == "PENDING" and "DependencyNeverSatisfied" in show.job.detail


async def test_a_job_needing_approval_runs_only_after_an_operator_approves_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    url = cluster.nats_url
    job = (await submit(url, QUICK, ("-p", "large"), user="root")).job_ids[0]
    await asyncio.sleep(2.0)  # several placer cycles
    assert await job_state(db, job) is None
    await call(url, "approve", JobSelector(user="root", job_refs=(str(job),)), Ok)
    await eventually(lambda: job_state(db, job), lambda s: s == "COMPLETED", 60, "approved job")
