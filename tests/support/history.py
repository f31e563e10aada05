"""What the database still holds about jobs: every row, in every table, that names one
of them or one of their allocations (the purge of finished jobs leaves none)."""

from __future__ import annotations

import asyncpg

# Every column that names a job or one of its allocations.
JOB_KEYS = ("job_id", "victim_job_id", "alloc_id", "victim_alloc_id")


async def rows_of(db: asyncpg.Connection, jobs: list[int]) -> dict[str, int]:
    """Rows naming any of these jobs (or their allocations), per table and column."""
    allocs = [
        r["alloc_id"]
        for r in await db.fetch("SELECT alloc_id FROM allocations WHERE job_id = ANY($1)", jobs)
    ]
    columns = await db.fetch(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND column_name = ANY($1::text[])",
        list(JOB_KEYS),
    )
    found: dict[str, int] = {}
    for c in columns:
        ids = allocs if c["column_name"].endswith("alloc_id") else jobs
        n = await db.fetchval(
            f"SELECT count(*) FROM {c['table_name']} WHERE {c['column_name']} = ANY($1::bigint[])",
            ids,
        )
        if n:
            found[f"{c['table_name']}.{c['column_name']}"] = n
    return found
