"""Fault-to-restart latency: an XID 79 injected at a simulated GPU under a running
elastic job, until its workers run again on the surviving nodes.

The clock starts when the injection request is sent (it enters at the GPU, so the
probe, the health monitor, the bus and the launcher all sit on the measured path) and
stops at the new generation's `segment_start`, written once every surviving node's agent
has a started worker process (the job's own start-up is excluded). Between runs the
node is rebooted and an operator resumes it. Prints percentiles, then one JSON object.

    .venv/bin/python bench/fault_to_restart.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import latency_figures, local_cluster, poll_run, wait_for_nodes
from muster.client import agent, call
from shared.api import (
    InjectFault,
    JobSelector,
    NodeAction,
    Ok,
    SubmitReply,
    SubmitRequest,
)

SCRIPT = "#!/bin/bash\nsleep 600\n"


async def one_run(url: str, db: asyncpg.Connection) -> float:
    req = SubmitRequest(user="root", script=SCRIPT, argv=("--nodes=2:3", "--gpus-per-node=4"))
    job_id = (await call(url, "submit", req, SubmitReply)).job_ids[0]
    row = await poll_run(db, job_id, lambda r: r["state"] == "RUNNING")
    victim = row["nodes"][0]
    t0 = time.time()
    await agent(url, victim, "inject", InjectFault(gpu=0, xid=79))
    row = await poll_run(db, job_id, lambda r: r["restart_count"] == 1 and r["state"] == "RUNNING")
    latency = row["seg"] - t0
    await call(url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)
    await poll_run(db, job_id, lambda r: r["state"] == "CANCELLED")
    await agent(url, victim, "reboot", InjectFault())
    await call(url, "resume", NodeAction(user="root", node=victim, reason="bench"), Ok)
    await wait_for_nodes(db, 4)
    return float(latency)


async def measure(url: str, db_url: str, runs: int) -> list[float]:
    db = await asyncpg.connect(db_url)
    await wait_for_nodes(db, 4)
    out = [await one_run(url, db) for _ in range(runs)]
    await db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with local_cluster(4) as cluster:
        lat = asyncio.run(measure(cluster.nats_url, cluster.database_url, args.runs))
    result = latency_figures("fault_to_restart", lat)
    print(
        f"XID -> workers running again over {len(lat)} runs:"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
