"""The purge of finished jobs (migration 0027, services/admission/purge.py) and the trim
of the hourly usage and GPU time, on real PostgreSQL: a job goes with every row about
it, in every service's tables, once it finished longer ago than the cluster keeps it,
and never before: not while any state of its run is live, not within the 8-day floor whatever the
setting, not while an allocation, a step or a charge of it is open. Batches are bounded
and two pruners share them."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from services.admission.purge import PURGE_JOBS
from services.fairshare.repo import PRUNE_USAGE_HOURS
from services.health.repo import PRUNE_CLUSTER_HOURS
from shared.retention import DAY_S, Kept, Pruned, Retention, prune
from shared.states import RUN_STATES, TERMINAL, JobState
from tests.support.history import rows_of

YEAR = 365 * DAY_S
PURGE = Kept(PURGE_JOBS, YEAR, counts=True)


async def ended_job(
    db: asyncpg.Connection,
    ended_days_ago: float | None,
    state: str = JobState.COMPLETED,
    *,
    live_allocation: bool = False,
    running_step: bool = False,
    unsettled: bool = False,
) -> int:
    """A job with a row in every table the services write about one, as they leave
    them after its end (`ended_days_ago` None: no run yet, a waiting job)."""
    job = await db.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec) VALUES ('train', 'alice', 'ml', 'gpu', 'normal',"
        " 1, 1, 1, 3600, '{}') RETURNING job_id"
    )
    await db.execute("INSERT INTO pending_reasons(job_id, reason) VALUES ($1, 'Resources')", job)
    await db.execute("INSERT INTO job_priorities(job_id, total, factors) VALUES ($1, 1, '{}')", job)
    if ended_days_ago is None:
        return int(job)
    ended = f"now() - make_interval(secs => {ended_days_ago * DAY_S})"
    await db.execute(
        "INSERT INTO job_runs(job_id, state, attempt, nodes, started_at, ended_at)"
        f" VALUES ($1, $2, 1, '{{n1}}', {ended} - interval '1 hour', {ended})",
        job,
        state,
    )
    alloc = await db.fetchval(
        "INSERT INTO allocations(job_id, attempt, epoch, released_at)"
        f" VALUES ($1, 1, 1, CASE WHEN $2 THEN NULL ELSE {ended} END) RETURNING alloc_id",
        job,
        live_allocation,
    )
    await db.execute(
        "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus, live)"
        " VALUES ($1, 'n1', 0, '{0}', $2)",
        alloc,
        live_allocation,
    )
    await db.execute(
        "INSERT INTO allocation_gpus(alloc_id, node, gpu, live) VALUES ($1, 'n1', $2, $3)",
        alloc,
        job,  # a GPU of its own: at most one live holder of each
        live_allocation,
    )
    await db.execute(
        "INSERT INTO preemptions(victim_alloc_id, victim_job_id, for_job_id, epoch)"
        " VALUES ($1, $2, 0, 1)",
        alloc,
        job,
    )
    await db.execute(
        "INSERT INTO attempts(job_id, attempt, seq, nodes, world_size, reason)"
        " VALUES ($1, 1, 0, '{n1}', 1, 'start')",
        job,
    )
    await db.execute(
        "INSERT INTO worker_exits(job_id, attempt, generation, node, exit_code)"
        " VALUES ($1, 1, 0, 'n1', 0)",
        job,
    )
    await db.execute(
        "INSERT INTO job_steps(job_id, step_id, attempt, argv, nodes, ntasks, state)"
        " VALUES ($1, 0, 1, '{true}', '{n1}', 1, $2)",
        job,
        "RUNNING" if running_step else "COMPLETED",
    )
    await db.execute("INSERT INTO launcher_mailbox(job_id, event) VALUES ($1, '\\x00'::bytea)", job)
    await db.execute(
        "INSERT INTO usage_charges(job_id, attempt, user_name, account, settled)"
        " VALUES ($1, 1, 'alice', 'ml', $2)",
        job,
        not unsettled,
    )
    return int(job)


@pytest.fixture
async def lease(db: asyncpg.Connection) -> None:
    """The placer's lease at epoch 1: allocations are fenced to its holder's epoch."""
    await db.execute(
        "INSERT INTO placer_lease(id, holder, epoch, expires_at)"
        " VALUES (1, 'test', 1, now() + interval '1 hour')"
    )


@pytest.mark.usefixtures("lease")
async def test_a_finished_job_goes_with_every_row_about_it_and_a_live_one_never(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    old = {state: await ended_job(db, 400, state) for state in sorted(RUN_STATES)}
    waiting = await ended_job(db, None)
    recent = await ended_job(db, 30)
    before = await rows_of(db, [*old.values(), waiting, recent])
    assert "jobs.job_id" in before and "allocation_gpus.alloc_id" in before

    pruned = await prune(pool, Retention(), [PURGE])
    gone = [j for s, j in old.items() if s in TERMINAL]
    assert pruned.own == len(gone) == len(TERMINAL)
    assert await rows_of(db, gone) == {}  # every table, every service's rows
    kept = [j for s, j in old.items() if s not in TERMINAL]  # live, or back in the queue
    assert sorted(kept) == sorted(
        r["job_id"]
        for r in await db.fetch("SELECT job_id FROM job_runs WHERE job_id <> $1", recent)
    )
    assert (await rows_of(db, [waiting]))["jobs.job_id"] == 1
    assert (await rows_of(db, [recent]))["job_runs.job_id"] == 1
    assert await prune(pool, Retention(), [PURGE]) == Pruned(0, 0)


@pytest.mark.usefixtures("lease")
async def test_no_setting_purges_a_job_within_the_floor_nor_one_still_open(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    inside = await ended_job(db, 7.9)  # an event about it may still be redelivered
    outside = await ended_job(db, 8.1)
    held = [
        await ended_job(db, 400, live_allocation=True),
        await ended_job(db, 400, running_step=True),
        await ended_job(db, 400, unsettled=True),
    ]
    # the setting asks for nothing kept: the function keeps 8 days anyway
    assert await prune(pool, Retention(), [Kept(PURGE_JOBS, 0.0, counts=True)]) == Pruned(
        0, 0, own=1
    )
    assert await rows_of(db, [outside]) == {}
    left = await db.fetch("SELECT job_id FROM jobs ORDER BY job_id")
    assert [r["job_id"] for r in left] == [inside, *held]


@pytest.mark.usefixtures("lease")
async def test_a_job_a_waiting_job_depends_on_stays_while_it_waits(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """A FAILED job's `afterok` is never met; gone, the dependent would read it as met and
    start a year late. So it stays while the dependent waits (an array by its id: every
    task), and goes with the next pass once the dependent ended. Kept, the oldest do not
    shorten a batch: the pass removes every other old job, in full batches."""
    failed = await ended_job(db, 500, JobState.FAILED)  # the oldest: each batch's head
    array = [await ended_job(db, 500) for _ in range(2)]
    await db.execute("UPDATE jobs SET array_job_id = $1 WHERE job_id = ANY($2)", array[0], array)
    others = [await ended_job(db, 400) for _ in range(5)]
    waiting = await ended_job(db, None)
    deps = [{"kind": "afterok", "job_ids": [failed, array[0]], "delay_s": 0, "tasks": []}]
    await db.execute(
        "UPDATE jobs SET spec = jsonb_build_object('dependencies', $2::jsonb) WHERE job_id = $1",
        waiting,
        json.dumps(deps),
    )
    assert await prune(pool, Retention(batch=2), [PURGE]) == Pruned(0, 0, own=5)
    assert await rows_of(db, others) == {}
    assert (await rows_of(db, [failed, *array]))["jobs.job_id"] == 3
    # the dependent is cancelled before it ran: nothing waits on them any more
    await db.execute(
        "INSERT INTO job_runs(job_id, state, ended_at) VALUES ($1, 'CANCELLED', now())", waiting
    )
    assert await prune(pool, Retention(), [PURGE]) == Pruned(0, 0, own=3)
    assert await rows_of(db, [failed, *array]) == {}


@pytest.mark.usefixtures("lease")
async def test_purges_go_in_bounded_batches_and_two_pruners_share_them(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    jobs = [await ended_job(db, 400 + i) for i in range(30)]
    small = Retention(batch=4)
    both = await asyncio.gather(prune(pool, small, [PURGE]), prune(pool, small, [PURGE]))
    assert sum(p.own for p in both) == 30
    assert await rows_of(db, jobs) == {}


async def test_the_hourly_usage_and_gpu_time_go_once_older_than_kept(
    db: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    await db.execute(
        "INSERT INTO usage_hours(hour, account, user_name, gpu_seconds, billed)"
        " SELECT date_trunc('hour', now()) - make_interval(hours => h), 'ml', 'alice', 3600, 3600"
        " FROM generate_series(0, 24 * 40) h"
    )
    await db.execute(
        "INSERT INTO cluster_hours(hour, state, gpu_seconds)"
        " SELECT date_trunc('hour', now()) - make_interval(hours => h), 'IDLE', 3600"
        " FROM generate_series(0, 24 * 40) h"
    )
    kept = [Kept(PRUNE_USAGE_HOURS, 30 * DAY_S), Kept(PRUNE_CLUSTER_HOURS, 30 * DAY_S)]
    pruned = await prune(pool, Retention(batch=100), kept)
    assert pruned.own == 2 * (24 * 10 + 1)  # the hours that began 30 days ago or before
    for table in ("usage_hours", "cluster_hours"):
        oldest = await db.fetchval(f"SELECT now() - min(hour) FROM {table}")
        assert oldest.total_seconds() <= 30 * DAY_S
