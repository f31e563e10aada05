"""What the purge of finished jobs costs (migration 0027, services/admission/purge.py).

A throwaway PostgreSQL holds `--jobs` finished jobs, each with the rows the services
leave (run, allocation with a node and a GPU row, attempt, worker exit, step, charge),
`--old` of them ended over a year ago; the rest ended a day ago; `--waiting` jobs wait,
each depending on one of the recent ones (the purge reads what they depend on). Measures one purge
pass over that history with nothing old enough (the common case: every pass of every
admission replica), then the batches that remove the old jobs, as admission's pruner
runs them (`--batch` jobs each). Prints one line per figure, then one JSON object.

    .venv/bin/python bench/job_purge.py [--jobs 200000] [--old 100000] [--waiting 10000]
                                        [--batch 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import throwaway_database
from services.admission.purge import PURGE_JOBS
from shared.db import migrate

YEAR_S = 365 * 86400.0

# (table, columns, values over i: the job id, and old: whether it ended a year ago)
ROWS = (
    (
        "jobs(job_id, name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec)",
        "i, 'train', 'u' || (i % 50), 'a', 'gpu', 'normal', 1, 1, 1, 3600, '{}'",
    ),
    (
        "job_runs(job_id, state, attempt, nodes, started_at, ended_at)",
        "i, 'COMPLETED', 1, ARRAY['n' || (i % 64)], ended - interval '1 hour', ended",
    ),
    ("allocations(alloc_id, job_id, attempt, epoch, released_at)", "i, i, 1, 1, ended"),
    ("allocation_nodes(alloc_id, node, rank, gpus, live)", "i, 'n' || (i % 64), 0, '{0}', false"),
    ("allocation_gpus(alloc_id, node, gpu, live)", "i, 'n' || (i % 64), 0, false"),
    (
        "attempts(job_id, attempt, seq, nodes, world_size, reason, started_at, ended_at)",
        "i, 1, 0, ARRAY['n' || (i % 64)], 1, 'start', ended - interval '1 hour', ended",
    ),
    ("worker_exits(job_id, attempt, generation, node, exit_code)", "i, 1, 0, 'n1', 0"),
    (
        "job_steps(job_id, step_id, attempt, argv, nodes, ntasks, state, ended_at)",
        "i, 0, 1, '{true}', '{n1}', 1, 'COMPLETED', ended",
    ),
    (
        "usage_charges(job_id, attempt, user_name, account, settled)",
        "i, 1, 'u' || (i % 50), 'a', true",
    ),
)


async def load(db: asyncpg.Connection, jobs: int, old: int, waiting: int) -> None:
    async with db.transaction():
        await db.execute("SET LOCAL session_replication_role = replica")  # a bulk load
        for table, values in ROWS:
            await db.execute(
                f"INSERT INTO {table} SELECT {values} FROM ("
                " SELECT i, now() - CASE WHEN i <= $2 THEN interval '400 days'"
                " ELSE interval '1 day' END AS ended FROM generate_series(1, $1::int) i) s",
                jobs,
                old,
            )
        await db.execute(
            "INSERT INTO jobs(job_id, name, user_name, account, partition, qos, nodes_min,"
            " nodes_max, gpus_per_node, time_limit_s, spec)"
            " SELECT $1 + i, 'eval', 'u1', 'a', 'gpu', 'normal', 1, 1, 1, 3600,"
            " jsonb_build_object('dependencies', jsonb_build_array(jsonb_build_object("
            "'kind', 'afterok', 'job_ids', jsonb_build_array($1 - i % 1000), 'delay_s', 0)))"
            " FROM generate_series(1, $2::int) i",
            jobs,
            waiting,
        )
        await db.execute(
            "INSERT INTO waiting_jobs SELECT $1 + i FROM generate_series(1, $2::int) i",
            jobs,
            waiting,
        )
    await db.execute("ANALYZE")


async def measure(
    url: str, jobs: int, old: int, waiting: int, batch: int
) -> dict[str, float | int]:
    db = await asyncpg.connect(url)
    try:
        await migrate(db)
        await load(db, jobs, old, waiting)
        idle = []
        for _ in range(20):  # a pass that finds nothing: a keep longer than any age here
            t = time.perf_counter()
            await db.fetchval(PURGE_JOBS, 2 * YEAR_S, batch)
            idle.append((time.perf_counter() - t) * 1000)
        batches, removed = [], 0
        while True:
            t = time.perf_counter()
            n = await db.fetchval(PURGE_JOBS, YEAR_S, batch)
            if not n:
                break
            batches.append((time.perf_counter() - t) * 1000)
            removed += n
        left = await db.fetchval("SELECT count(*) FROM jobs") - waiting
    finally:
        await db.close()
    return {
        "jobs": jobs,
        "old": old,
        "waiting": waiting,
        "batch": batch,
        "removed": removed,
        "left": left,
        "idle_pass_ms_p50": round(statistics.median(idle), 2),
        "batch_ms_p50": round(statistics.median(batches), 1),
        "batch_ms_max": round(max(batches), 1),
        "jobs_per_s": round(removed / (sum(batches) / 1000)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--old", type=int, default=100_000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=5_000)
    args = parser.parse_args()
    with throwaway_database() as url:
        out = asyncio.run(measure(url, args.jobs, args.old, args.waiting, args.batch))
    print(f"idle pass (nothing old enough) p50: {out['idle_pass_ms_p50']} ms")
    print(f"batch of {args.batch} jobs: p50 {out['batch_ms_p50']} ms, max {out['batch_ms_max']} ms")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
