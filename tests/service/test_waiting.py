"""The waiting set on real PostgreSQL (shared/waiting.py, migration 0019): the triggers
keep `waiting_jobs` through every write that moves a job in or out of the queue, so the
narrowed query reads exactly the jobs the full definition names, whatever has run."""

from __future__ import annotations

import asyncpg
import msgspec

from services.admission.repo import insert_job
from shared.jobspec import JobSpec
from shared.states import JobState
from shared.waiting import fetch_waiting

SPEC = JobSpec(
    user="alice", account="a", partition="normal", script="#!/bin/bash\ntrue\n",
    nodes_min=1, nodes_max=1, gpus_per_node=1, time_limit_s=600,
)  # fmt: skip

# The definition itself, over every job: what the set must agree with.
EVERY_JOB = (
    "SELECT j.job_id FROM jobs j LEFT JOIN job_runs r USING (job_id)"
    " WHERE j.cancel_requested_at IS NULL AND (r.state IS NULL OR r.state = $1)"
    " AND NOT EXISTS (SELECT 1 FROM allocations a"
    "   WHERE a.job_id = j.job_id AND a.released_at IS NULL)"
    " ORDER BY j.job_id"
)


async def waiting(db: asyncpg.Connection) -> list[int]:
    narrowed = [r["job_id"] for r in await fetch_waiting(db, "j.job_id")]
    assert narrowed == [r["job_id"] for r in await db.fetch(EVERY_JOB, JobState.REQUEUED)]
    return narrowed


async def run(db: asyncpg.Connection, job_id: int, state: JobState) -> None:
    """The launcher's writes: a run started, then its state changed (as an upsert, as
    `finish_unstarted` writes a job cancelled before it ran)."""
    await db.execute(
        "INSERT INTO job_runs(job_id, state) VALUES ($1, $2)"
        " ON CONFLICT (job_id) DO UPDATE SET state = $2",
        job_id,
        state,
    )


async def test_a_job_leaves_the_queue_when_its_run_starts_and_comes_back_when_requeued(
    db: asyncpg.Connection,
) -> None:
    first, second = await insert_job(db, SPEC), await insert_job(db, SPEC)
    assert await waiting(db) == [first, second]
    await run(db, first, JobState.STARTING)
    assert await waiting(db) == [second]
    await run(db, first, JobState.REQUEUED)  # a fault, a preemption: back in the queue
    assert await waiting(db) == [first, second]
    await run(db, first, JobState.STARTING)
    await run(db, first, JobState.COMPLETED)
    await run(db, second, JobState.CANCELLED)  # cancelled before it ran
    assert await waiting(db) == []


async def test_jobs_inserted_together_all_wait_and_history_is_not_read(
    db: asyncpg.Connection,
) -> None:
    """Admission's group commit inserts many jobs in one statement; a thousand finished
    jobs are not in the set the queue query reads."""
    ids = await db.fetch(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec)"
        " SELECT 'j', 'alice', 'a', 'normal', 'normal', 1, 1, 1, 600, $1::jsonb"
        " FROM generate_series(1, 1000) RETURNING job_id",
        msgspec.json.encode(SPEC).decode(),
    )
    done = [r["job_id"] for r in ids]
    for job_id in done[:-2]:
        await run(db, job_id, JobState.COMPLETED)
    cancelled = done[-1]
    await db.execute("UPDATE jobs SET cancel_requested_at = now() WHERE job_id = $1", cancelled)
    assert await waiting(db) == [done[-2]]  # the cancelled one is kept out by the query
    assert await db.fetchval("SELECT count(*) FROM waiting_jobs") == 2
