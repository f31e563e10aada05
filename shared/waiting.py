"""Plumbing: the one definition of "a job waiting for an allocation", as SQL.

The placer places these jobs and fairshare ranks them; both must mean the same set, so
both load it here: not cancelled, with no run yet or a run handed back to the queue (a
fault, a preemption), and holding no live allocation. Each reader picks its columns.
"""

from __future__ import annotations

import asyncpg

from shared.db import Conn
from shared.states import JobState

# `waiting_jobs` (migration 0019, kept by triggers) holds the jobs with no run or a
# requeued one: the query reads the queue, not every job that ever ran. Each waiting
# job's row and run are looked up by key (each LIMIT keeps the planner from turning a
# lookup back into a join): the queue is often empty when last analyzed, and for the
# few hundred or thousand rows PostgreSQL then guesses it holds, it hashed every job or
# every run ever recorded, each cycle (1.4-2.9 ms after 20,000 jobs, on every start's
# path). By key, a cycle's read grows with the queue, never with the history.
WAITING_FROM = (
    " FROM waiting_jobs w"
    " JOIN LATERAL (SELECT * FROM jobs j WHERE j.job_id = w.job_id LIMIT 1) j ON true"
    " LEFT JOIN LATERAL (SELECT * FROM job_runs r WHERE r.job_id = w.job_id LIMIT 1) r ON true"
    " WHERE j.cancel_requested_at IS NULL"
    " AND (r.state IS NULL OR r.state = $1)"
    " AND NOT EXISTS (SELECT 1 FROM allocations a"
    "   WHERE a.job_id = j.job_id AND a.released_at IS NULL)"
    " ORDER BY j.job_id"
)


async def fetch_waiting(conn: Conn, columns: str) -> list[asyncpg.Record]:
    """`columns` (over `jobs j` and `job_runs r`; `$1` is the requeued state) of every
    job waiting for an allocation, in job id order."""
    return list(await conn.fetch(f"SELECT {columns}{WAITING_FROM}", JobState.REQUEUED))
