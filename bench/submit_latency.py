"""Submit-to-running latency on an idle local cluster.

Submits jobs one at a time (each to an idle cluster) and measures, from the database's
own clock, the time from the job's commit (`jobs.submitted_at`) to its workers running
on every node (`job_runs.started_at`, written once all agents report a started
process). Prints one line per percentile, then one JSON object.

    .venv/bin/python bench/submit_latency.py [--jobs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import latency_figures, local_cluster, wait_for_nodes
from muster.client import call
from shared.api import SubmitReply, SubmitRequest

SCRIPT = "#!/bin/bash\ntrue\n"


async def measure(nats_url: str, db_url: str, jobs: int) -> list[float]:
    db = await asyncpg.connect(db_url)
    await wait_for_nodes(db, 2)
    latencies = []
    for _ in range(jobs):
        req = SubmitRequest(user="root", script=SCRIPT, argv=("--nodes=2", "--gpus-per-node=2"))
        job_id = (await call(nats_url, "submit", req, SubmitReply)).job_ids[0]
        while True:
            row = await db.fetchrow(
                "SELECT extract(epoch FROM r.started_at - j.submitted_at)::float8 AS s, r.state"
                " FROM jobs j JOIN job_runs r USING (job_id) WHERE job_id = $1",
                job_id,
            )
            if row is not None and row["s"] is not None and row["state"] not in ("RUNNING",):
                latencies.append(row["s"])
                break
            await asyncio.sleep(0.005)
    await db.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    with local_cluster(2) as cluster:
        lat = asyncio.run(measure(cluster.nats_url, cluster.database_url, args.jobs))
    result = latency_figures("submit_to_running", lat, nodes_per_job=2)
    print(
        f"submit -> running over {len(lat)} jobs:"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
