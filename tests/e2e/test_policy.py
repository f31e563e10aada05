"""End to end: the cluster configuration reaches the placer — partitions' node sets,
QOS running limits, preemption of a lower tier with its grace time — the blockers the
placer decides from what its repo loads (a singleton's live namesake, a future begin),
and runtime predictions learned from the job history."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.cluster import Cluster
from shared.api import ShowJobReply, ShowJobRequest
from tests.support.cluster import eventually, job_state, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

CONFIG = """
[cluster]
name = "policy-test"
default_partition = "normal"
default_qos = "normal"

[partitions.normal]
nodes = ["node[01-02]"]
default_time = "1:00:00"
max_time = "2:00:00"
priority_tier = 10
preempt_mode = "requeue"
grace_time = "2"

[partitions.small]
nodes = ["node01"]
default_time = "10:00"
max_time = "1:00:00"
priority_tier = 10

[partitions.inference]
nodes = ["node[01-02]"]
default_time = "1:00:00"
max_time = "2:00:00"
priority_tier = 50
preempt_mode = "off"
can_preempt = ["normal"]

[qos.normal]
max_gpus_per_user = 4
min_runtime = "0"

[qos.wide]
min_runtime = "0"

[accounts.root]
shares = 1

[accounts.research]
parent = "root"
shares = 1

[users.root]
accounts = ["research"]

[roles]
operators = ["root"]
"""

SLEEP = "#!/bin/bash\nsleep 120\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with _cluster(CONFIG, tmp_path, nats_url, database_url, db) as c:
        yield c


@contextlib.asynccontextmanager
async def _cluster(
    text: str,
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    db: asyncpg.Connection,
    partitions: int = 3,
) -> AsyncIterator[Cluster]:
    config = tmp_path / "cluster.toml"
    config.write_text(text)
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(2),
        env={"MUSTER_CLUSTER_CONFIG": str(config)},
    ) as c:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM partition_policy"),
            lambda n: n == partitions,
            20,
            "policy",
        )
        yield c


async def _wait_reason(db: asyncpg.Connection, job_id: int) -> str:
    reason: str = await eventually(
        lambda: db.fetchval("SELECT reason FROM pending_reasons WHERE job_id = $1", job_id),
        lambda r: r is not None,
        20,
        f"a pending reason for job {job_id}",
    )
    return reason


async def test_a_partition_runs_only_on_its_nodes(cluster: Cluster, db: asyncpg.Connection) -> None:
    ids: list[int] = []
    for _ in range(2):
        reply = await submit(
            cluster.nats_url, SLEEP, ("-p", "small", "-q", "wide", "--gpus-per-node=2")
        )
        ids += reply.job_ids
    for job_id in ids:
        await eventually(partial(job_state, db, job_id), lambda s: s == "RUNNING", 30, "running")
    used = await db.fetch(
        "SELECT DISTINCT n.node FROM allocation_nodes n JOIN allocations a USING (alloc_id)"
        " WHERE a.job_id = ANY($1::bigint[])",
        ids,
    )
    assert [r["node"] for r in used] == ["node01"]
    third = (
        await submit(cluster.nats_url, SLEEP, ("-p", "small", "-q", "wide", "--gpus-per-node=2"))
    ).job_ids
    assert await _wait_reason(db, third[0]) == "RESOURCES"  # node02 is free, but not small's


async def test_a_qos_gpu_limit_per_user_holds_the_next_job_back(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = (await submit(cluster.nats_url, SLEEP, ("--gpus-per-node=4",))).job_ids[0]
    await eventually(lambda: job_state(db, first), lambda s: s == "RUNNING", 30, "first runs")
    second = (await submit(cluster.nats_url, SLEEP, ("--gpus-per-node=4",))).job_ids[0]
    assert await _wait_reason(db, second) == "QOS_MAX_GPUS_PER_USER"
    wide = (await submit(cluster.nats_url, SLEEP, ("--gpus-per-node=4", "-q", "wide"))).job_ids
    await eventually(lambda: job_state(db, wide[0]), lambda s: s == "RUNNING", 30, "other QOS")


async def test_a_future_begin_and_a_live_namesake_hold_jobs_back_with_their_own_reasons(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = (await submit(cluster.nats_url, SLEEP, ("-J", "train", "--gpus-per-node=1"))).job_ids[0]
    await eventually(lambda: job_state(db, first), lambda s: s == "RUNNING", 30, "first runs")
    args = ("-J", "train", "-d", "singleton", "--gpus-per-node=1")
    single = (await submit(cluster.nats_url, SLEEP, args)).job_ids[0]
    later = (await submit(cluster.nats_url, SLEEP, ("--begin=now+1hour",))).job_ids[0]

    assert await _wait_reason(db, single) == "SINGLETON"
    assert await _wait_reason(db, later) == "BEGIN_TIME"
    detail = await db.fetchval("SELECT detail FROM pending_reasons WHERE job_id = $1", single)
    assert detail == f"Dependency: waiting for singleton (job {first})"
    assert await job_state(db, single) is None and await job_state(db, later) is None


async def test_a_higher_tier_preempts_a_lower_one_after_its_grace_and_requeues_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    low: list[int] = []
    for qos in ("normal", "wide"):  # two users' worth of GPUs: the cluster is full
        reply = await submit(cluster.nats_url, SLEEP, ("--gpus-per-node=4", "-q", qos))
        low += reply.job_ids
    for job_id in low:
        await eventually(partial(job_state, db, job_id), lambda s: s == "RUNNING", 30, "low")
    high = await submit(
        cluster.nats_url, SLEEP, ("-p", "inference", "-q", "wide", "--gpus-per-node=4")
    )
    high_id = high.job_ids[0]

    await eventually(lambda: job_state(db, high_id), lambda s: s == "RUNNING", 60, "preemptor")
    victims = await db.fetch(
        "SELECT victim_job_id, for_job_id FROM preemptions WHERE for_job_id = $1", high_id
    )
    assert len(victims) == 1
    victim = victims[0]["victim_job_id"]
    row = await db.fetchrow("SELECT state, restart_count FROM job_runs WHERE job_id = $1", victim)
    assert row is not None
    assert row["state"] in ("REQUEUED", "STARTING", "RUNNING") and row["restart_count"] == 1
    history = await db.fetch(
        "SELECT outcome, extract(epoch FROM ended_at - started_at) AS ran FROM attempts"
        " WHERE job_id = $1 ORDER BY attempt, seq",
        victim,
    )
    assert "preempt" in (history[0]["outcome"] or "")


async def test_a_job_that_would_run_into_a_maintenance_window_waits_and_a_short_one_runs(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    start = datetime.fromtimestamp(time.time() + 600, UTC).isoformat()
    window = f"""
[reservations.maintenance]
start = "{start}"
duration = "1:00:00"
maintenance = true
"""
    async with _cluster(CONFIG + window, tmp_path, nats_url, database_url, db) as c:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM reservations"), lambda n: n == 1, 20, "rsv"
        )
        long = (await submit(c.nats_url, SLEEP, ("--time=30", "-q", "wide"))).job_ids[0]
        short = (await submit(c.nats_url, SLEEP, ("--time=5", "-q", "wide"))).job_ids[0]
        await eventually(lambda: job_state(db, short), lambda s: s == "RUNNING", 30, "short")
        assert await _wait_reason(db, long) == "RESERVATION"
        detail = await db.fetchval("SELECT detail FROM pending_reasons WHERE job_id = $1", long)
        assert "maintenance" in detail


DEBUG = """
[partitions.debug]
nodes = ["node02"]
default_time = "10:00"
max_time = "30:00"
priority_tier = 100
reserved_gpus = 2
"""


async def test_gpus_kept_for_debug_stay_free_for_a_debug_job(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with _cluster(CONFIG + DEBUG, tmp_path, nats_url, database_url, db, partitions=4) as c:
        big: list[int] = []
        for _ in range(2):
            reply = await submit(c.nats_url, SLEEP, ("--gpus-per-node=4", "-q", "wide"))
            big += reply.job_ids
        await eventually(lambda: job_state(db, big[0]), lambda s: s == "RUNNING", 30, "first")
        assert await _wait_reason(db, big[1]) == "RESOURCES"  # node02 keeps 2 of its 4
        debug = await submit(c.nats_url, SLEEP, ("-p", "debug", "--gpus-per-node=2"))
        job = debug.job_ids[0]
        await eventually(lambda: job_state(db, job), lambda s: s == "RUNNING", 30, "debug runs")
        node = await db.fetchval(
            "SELECT n.node FROM allocation_nodes n JOIN allocations a USING (alloc_id)"
            " WHERE a.job_id = $1",
            job,
        )
        assert node == "node02"
        assert await job_state(db, big[1]) is None  # still waiting: debug's GPUs are kept


async def test_a_waiting_job_is_booked_on_the_predicted_end_of_the_job_before_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """Two short runs of `quick` teach the placer its runtime; a third one, asking an
    hour, holds both nodes: the job behind it is booked a minute or two after it began
    (the prediction, extended if outlived), not an hour after (its limit)."""
    wide = ("-J", "quick", "-N", "2", "--gpus-per-node=4", "-q", "wide", "-t", "1:00:00")
    for _ in range(2):
        short = (await submit(cluster.nats_url, "#!/bin/bash\nsleep 1\n", wide)).job_ids[0]
        await eventually(partial(job_state, db, short), lambda s: s == "COMPLETED", 120, "ran")
    blocker = (await submit(cluster.nats_url, SLEEP, wide)).job_ids[0]
    await eventually(lambda: job_state(db, blocker), lambda s: s == "RUNNING", 30, "blocker")
    behind = await submit(cluster.nats_url, SLEEP, ("-N", "2", "--gpus-per-node=4", "-q", "wide"))
    waiting = behind.job_ids[0]
    assert await _wait_reason(db, waiting) == "RESOURCES"
    ahead = await eventually(
        lambda: db.fetchval(
            "SELECT extract(epoch FROM p.estimated_start - r.started_at)::float8"
            " FROM pending_reasons p, job_runs r WHERE p.job_id = $1 AND r.job_id = $2",
            waiting,
            blocker,
        ),
        lambda s: s is not None,
        20,
        "an estimated start",
    )
    assert 0 < ahead < 1800, f"booked {ahead:.0f} s after the blocker began, not on its limit"
    # `muster show job` gives the same predicted end beside the hour's limit, and why.
    shown = await eventually(
        lambda: call(
            cluster.nats_url, "show", ShowJobRequest(user="root", job_id=blocker), ShowJobReply
        ),
        lambda r: r.predicted_end is not None,
        20,
        "a predicted end",
    )
    assert shown.job.started_at is not None and shown.predicted_end is not None
    assert 0 < shown.predicted_end - shown.job.started_at < 1800
    assert "named quick" in shown.predicted_why, shown.predicted_why
