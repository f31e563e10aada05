"""Recovery after a PostgreSQL restart on a local cluster.

Kills PostgreSQL (SIGKILL to the server and its backends), keeps it down for
`--outage` seconds, restarts it on the same port and data, then measures, from the
moment it is ready again, the time until the first job submitted after it is placed
(an allocation exists) and running (`job_runs.state = RUNNING` or later). Submitting
retries while admission answers "unavailable". Repeats `--runs` times; prints one line
per run, then one JSON object.

    .venv/bin/python bench/pg_restart.py [--runs 5] [--outage 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import FAST, latency_figures, provision_identity, wait_for_nodes
from muster.client import ApiRefused
from muster.cluster import Cluster, NodeDef
from shared import embedded
from tests.support.cluster import submit

SCRIPT = "#!/bin/bash\nsleep 0.2\n"
PLACED = "SELECT count(*) FROM allocations WHERE job_id = $1"
STARTED = "SELECT count(*) FROM job_runs WHERE job_id = $1 AND started_at IS NOT NULL"


async def submit_when_accepted(nats_url: str) -> int:
    while True:
        try:
            return (await submit(nats_url, SCRIPT)).job_ids[0]
        except (ApiRefused, TimeoutError):
            await asyncio.sleep(0.05)


async def poll(db_url: str, sql: str, job_id: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        conn = await asyncpg.connect(db_url, timeout=5)
        try:
            if await conn.fetchval(sql, job_id):
                return
        finally:
            await conn.close()
        await asyncio.sleep(0.02)
    raise SystemExit(f"job {job_id}: not done after {timeout_s} s: {sql}")


class Postgres:
    """The cluster's PostgreSQL, killed and restarted on the same port and data. Not
    `fast`: with synchronous_commit off a crash loses the last commits, which is what
    a benchmark of a crash must not measure."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.server = embedded.start_postgres(state)
        self.port = int(self.server.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server = embedded.start_postgres(self.state, self.port)


async def one_restart(pg: Postgres, cluster: Cluster, outage_s: float) -> tuple[float, float]:
    await asyncio.to_thread(pg.kill)
    await asyncio.sleep(outage_s)
    await asyncio.to_thread(pg.restart)
    back = time.monotonic()
    job_id = await submit_when_accepted(cluster.nats_url)
    await poll(cluster.database_url, PLACED, job_id)
    placed = time.monotonic() - back
    await poll(cluster.database_url, STARTED, job_id)
    return placed, time.monotonic() - back


async def measure(
    pg: Postgres, cluster: Cluster, runs: int, outage_s: float
) -> tuple[list[float], list[float]]:
    db = await asyncpg.connect(cluster.database_url)
    await wait_for_nodes(db, 2)
    await db.close()
    placed: list[float] = []
    running: list[float] = []
    for run in range(runs):
        to_placed, to_running = await one_restart(pg, cluster, outage_s)
        placed.append(to_placed)
        running.append(to_running)
        print(f"run {run + 1}: placed {to_placed:.2f} s, running {to_running:.2f} s")
    return placed, running


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--outage", type=float, default=5.0, help="seconds PostgreSQL is down")
    args = parser.parse_args()
    os.environ.update(FAST)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="muster-bench-", ignore_cleanup_errors=True) as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        nats = embedded.start_nats(state)
        pg = Postgres(state / "pg-state")
        provision_identity(state)  # requests are signed
        cluster = Cluster(state, nats.url, embedded.create_database(pg.server.url, "muster"))
        try:
            cluster.start_services()
            for i in range(2):
                cluster.start_node(NodeDef(f"node{i + 1:02d}", 4, "SIM-H100", ("spine0", "l1")))
            placed, running = asyncio.run(measure(pg, cluster, args.runs, args.outage))
        finally:
            cluster.stop_all()
            pg.server.stop()
            nats.stop()
    result = latency_figures("pg_restart_to_running", running, outage_s=args.outage)
    place = latency_figures("pg_restart_to_placed", placed)
    result |= {"placed_p50_ms": place["p50_ms"], "placed_p99_ms": place["p99_ms"]}
    print(
        f"PostgreSQL back -> first job placed p50 {place['p50_ms']} ms;"
        f" running p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
