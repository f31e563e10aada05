"""Launcher failover figure: two launcher replicas share the jobs by shard; the owner
of a running job is SIGKILLed and the job cancelled at once. Measured from the kill
(the database's clock) to the other replica's first write for the job (the cancel
decided: `job_runs.updated_at`), which it can only make once it holds the job's shard.
Goal <= 2 s. The killed replica is restarted, and the shards shared again, before the
next run.

The takeover is bounded by `--lease` (MUSTER_LAUNCHER_LEASE_S: a replica takes an
expired shard at its next pass, every quarter of it), so that is the knob; it is
printed with the figures.

    .venv/bin/python bench/launcher_failover.py [--runs 10] [--lease 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import latency_figures, local_cluster, wait_for_nodes
from muster.client import call
from muster.cluster import Cluster
from shared.api import JobSelector, Ok
from tests.support.cluster import submit

SLEEPER = "#!/bin/bash\nsleep 600\n"
OWNER = "SELECT holder FROM launcher_shards WHERE shard = launcher_shard($1) AND expires_at > now()"


async def until(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return value


def key_of(holder: str) -> str:
    instance = holder.split("-")[1]
    return "launcher" if instance == "0" else f"launcher-{instance}"


async def shared(db: asyncpg.Connection) -> bool:
    count = await db.fetchval(
        "SELECT count(DISTINCT holder) FROM launcher_shards WHERE expires_at > now()"
    )
    return bool(count == 2)


async def one_failover(cluster: Cluster, db: asyncpg.Connection) -> float:
    job_id = (await submit(cluster.nats_url, SLEEPER)).job_ids[0]

    async def running() -> bool:
        state = await db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job_id)
        return bool(state == "RUNNING")

    await until("the job running", running)
    holder = await db.fetchval(OWNER, job_id)
    key = key_of(holder)
    killed_at = await db.fetchval("SELECT clock_timestamp()")
    os.kill(cluster.pids[key], signal.SIGKILL)
    cluster.procs[key].wait(10)
    await call(cluster.nats_url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)

    async def acted() -> float | None:
        took: float | None = await db.fetchval(
            "SELECT extract(epoch FROM updated_at - $2::timestamptz)::float8 FROM job_runs"
            " WHERE job_id = $1 AND state <> 'RUNNING'",
            job_id,
            killed_at,
        )
        return took

    took = await until("the other replica's action", acted, 120)
    cluster.respawn(key)  # two replicas again for the next run
    await until("the shards shared again", lambda: shared(db))
    return float(took)


async def runs(cluster: Cluster, count: int) -> list[float]:
    db = await asyncpg.connect(cluster.database_url)
    try:
        await wait_for_nodes(db, 2)
        await until("both replicas holding shards", lambda: shared(db))
        out = []
        for run in range(count):
            took = await one_failover(cluster, db)
            out.append(took)
            print(f"run {run + 1}: the job's next action {took:.2f} s after its owner's kill")
        return out
    finally:
        await db.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--lease", type=float, default=1.5)
    args = parser.parse_args()
    env = {"MUSTER_LAUNCHER_LEASE_S": str(args.lease), "MUSTER_KILL_WAIT_S": "1"}
    replicas = {"launcher": 2}
    with local_cluster(2, replicas=replicas, env=env) as cluster:
        seconds = asyncio.run(runs(cluster, args.runs))
    result = latency_figures("launcher_failover", seconds, lease_s=args.lease)
    print(
        f"launcher owner SIGKILL -> its job's next action by the other replica:"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms (lease {args.lease} s)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
