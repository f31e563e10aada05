"""What counting the cluster's GPU time adds to each liveness pass of the health monitor
(services/health/utilization.py, migration 0028): the live allocations' GPUs read, the
GPUs tallied by state, the hour's rows added to, on a throwaway PostgreSQL holding
`--nodes` nodes of `--gpus` GPUs, half of them held by live allocations (of one node
each). Prints the p50 and p99 of `--passes` tallies, then one JSON object.

    .venv/bin/python bench/gpu_time_tally.py [--nodes 1000] [--gpus 8] [--passes 200]
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
from services.health import repo
from services.health.utilization import hour_of, tally
from shared.db import migrate


async def load(db: asyncpg.Connection, nodes: int, gpus: int) -> None:
    async with db.transaction():
        await db.execute("SET LOCAL session_replication_role = replica")  # a bulk load
        await db.execute(
            "INSERT INTO nodes(name) SELECT 'n' || i FROM generate_series(1, $1::int) i", nodes
        )
        await db.execute(
            "INSERT INTO gpus(node, idx, model) SELECT 'n' || i, g, 'SIM-H100'"
            " FROM generate_series(1, $1::int) i, generate_series(0, $2::int - 1) g",
            nodes,
            gpus,
        )
        # every other node's GPUs held by one job each
        await db.execute(
            "INSERT INTO jobs(job_id, name, user_name, account, partition, qos, nodes_min,"
            " nodes_max, gpus_per_node, time_limit_s, spec)"
            " SELECT i, 'j', 'u', 'a', 'p', 'normal', 1, 1, $2, 3600, '{}'"
            " FROM generate_series(1, $1::int, 2) i",
            nodes,
            gpus,
        )
        await db.execute(
            "INSERT INTO allocations(alloc_id, job_id, attempt, epoch)"
            " SELECT i, i, 1, 1 FROM generate_series(1, $1::int, 2) i",
            nodes,
        )
        await db.execute(
            "INSERT INTO allocation_gpus(alloc_id, node, gpu)"
            " SELECT i, 'n' || i, g"
            " FROM generate_series(1, $1::int, 2) i, generate_series(0, $2::int - 1) g",
            nodes,
            gpus,
        )
    await db.execute("ANALYZE")


async def measure(url: str, nodes: int, gpus: int, passes: int) -> dict[str, float | int]:
    db = await asyncpg.connect(url)
    try:
        await migrate(db)
        await load(db, nodes, gpus)
        health = await repo.load_health(db)
        took = []
        for _ in range(passes):
            t = time.perf_counter()
            async with db.transaction():
                held = await repo.allocated_gpus(db)
                counted = tally(health.values(), held, 1.0)
                await repo.add_gpu_time(
                    db, hour_of(time.time()), {str(k): v for k, v in counted.items()}
                )
            took.append((time.perf_counter() - t) * 1000)
        rows = await db.fetch("SELECT state, gpu_seconds FROM cluster_hours ORDER BY state")
    finally:
        await db.close()
    took.sort()
    return {
        "nodes": nodes,
        "gpus": nodes * gpus,
        "passes": passes,
        "tally_ms_p50": round(statistics.median(took), 2),
        "tally_ms_p99": round(took[int(0.99 * (len(took) - 1))], 2),
        "allocated_gpu_s": sum(r["gpu_seconds"] for r in rows if r["state"] == "ALLOCATED"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--passes", type=int, default=200)
    args = parser.parse_args()
    with throwaway_database() as url:
        out = asyncio.run(measure(url, args.nodes, args.gpus, args.passes))
    print(
        f"tally of {out['gpus']} GPUs: p50 {out['tally_ms_p50']} ms, p99 {out['tally_ms_p99']} ms"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
