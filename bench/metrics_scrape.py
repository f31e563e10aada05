"""Benchmark: /metrics scrape time of every service at 10,000 jobs and 1,000 nodes.

Starts embedded NATS and PostgreSQL, migrates, inserts --nodes nodes x 8 GPUs and --jobs
jobs directly (a share running on live allocations, a share completed with their
attempts, the rest pending with a reason), one `node.fault` outbox row per 10 nodes
(an XID that hit a job, restarted later) and usage for 8 accounts. Then serves each
service's metric sources (shared/metrics.py, in this process, on real HTTP) and times
--repeat scrapes of each: every scrape runs all of that service's queries. Prints one
line per service, then ONE JSON line. Usage:
    .venv/bin/python bench/metrics_scrape.py [--nodes 1000] [--jobs 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from shared import embedded
from shared.bus import Bus
from shared.db import migrate
from shared.events import NodeFault, encode
from shared.metrics import MetricsServer, sources_of
from shared.settings import Settings

GPUS = 8
SERVICES = ("admission", "placer", "launcher", "health", "fairshare")
JOB_COLUMNS = [
    "name",
    "user_name",
    "account",
    "partition",
    "qos",
    "nodes_min",
    "nodes_max",
    "gpus_per_node",
    "time_limit_s",
    "spec",
    "submitted_at",
]


async def fill(db: asyncpg.Connection, nodes: int, jobs: int) -> dict[str, int]:
    names = [f"n{i:04d}" for i in range(nodes)]
    await db.copy_records_to_table(
        "nodes",
        records=[
            (n, "UP" if i % 50 else "DRAINED", [f"leaf{i // 32}"]) for i, n in enumerate(names)
        ],
        columns=["name", "state", "topology"],
    )
    await db.copy_records_to_table(
        "gpus",
        records=[
            (n, g, "SIM-H100", not (i % 97 == 0 and g == 0))
            for i, n in enumerate(names)
            for g in range(GPUS)
        ],
        columns=["node", "idx", "model", "healthy"],
    )
    t0 = datetime.now(UTC) - timedelta(days=1)
    await db.copy_records_to_table(
        "jobs",
        records=[
            (
                f"job{j % 97}",
                f"user{j % 40}",
                f"acct{j % 8}",
                ("a100", "h100")[j % 2],
                "normal",
                1,
                1,
                4,
                3600,
                "{}",
                t0 + timedelta(seconds=j),
            )
            for j in range(jobs)
        ],
        columns=JOB_COLUMNS,
    )
    await db.execute("INSERT INTO placer_lease VALUES (1, 'bench', 3, now() + interval '1 day')")
    ids = [r["job_id"] for r in await db.fetch("SELECT job_id FROM jobs ORDER BY job_id")]
    running = ids[: nodes * GPUS // 4 // 2]  # half the GPUs busy, 4 per job
    done = ids[len(running) : len(running) + jobs // 2]
    runs = [(j, "RUNNING", 1, [names[i * 4 // GPUS]]) for i, j in enumerate(running)]
    runs += [(j, "COMPLETED" if j % 10 else "FAILED", 1, [names[0]]) for j in done]
    await db.copy_records_to_table(
        "job_runs", records=runs, columns=["job_id", "state", "attempt", "nodes"]
    )
    await db.copy_records_to_table(
        "attempts",
        records=[
            (j, 1, 0, [names[0]], 1, "start", t0 + timedelta(seconds=j + (j % 3600)))
            for j in (*running, *done)
        ],
        columns=["job_id", "attempt", "seq", "nodes", "world_size", "reason", "started_at"],
    )
    await db.executemany(
        "INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, 1, 3)", [(j,) for j in running]
    )
    allocs = await db.fetch("SELECT alloc_id FROM allocations ORDER BY job_id")
    await db.copy_records_to_table(
        "allocation_gpus",
        records=[
            (a["alloc_id"], names[i * 4 // GPUS], i * 4 % GPUS + g)
            for i, a in enumerate(allocs)
            for g in range(4)
        ],
        columns=["alloc_id", "node", "gpu"],
    )
    await db.copy_records_to_table(
        "allocation_nodes",
        records=[(a["alloc_id"], names[i * 4 // GPUS], 0, [0]) for i, a in enumerate(allocs)],
        columns=["alloc_id", "node", "rank", "gpus"],
    )
    pending = ids[len(running) + len(done) :]
    await db.copy_records_to_table(
        "pending_reasons",
        records=[(j, ("RESOURCES", "PRIORITY", "QOS_LIMIT")[j % 3]) for j in pending],
        columns=["job_id", "reason"],
    )
    faults = [
        NodeFault(
            event_id=uuid.uuid4(),
            occurred_at=t0 + timedelta(seconds=j),
            node=names[0],
            gpu=0,
            xid=(79, 48, 13)[k % 3],
            fault_class="node_reboot",
            action="drain",
            job_id=j,
        )
        for k, j in enumerate(done[:: max(1, len(done) // max(1, nodes // 10))])
    ]
    await db.copy_records_to_table(
        "outbox",
        records=[(f.event_id, "muster.node.fault", encode(f), datetime.now(UTC)) for f in faults],
        columns=["event_id", "subject", "payload", "published_at"],
    )
    await db.copy_records_to_table(
        "usage",
        records=[(f"user{u}", f"acct{u % 8}", 1000.0 * u, 10.0 * u) for u in range(40)],
        columns=["user_name", "account", "gpu_seconds", "decayed"],
    )
    return {
        "running": len(running),
        "ended": len(done),
        "pending": len(pending),
        "faults": len(faults),
    }


async def scrape(url: str) -> int:
    host, rest = url.removeprefix("http://").split(":", 1)
    port, path = rest.split("/", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    return len(raw)


def sources_down(text: str) -> list[str]:
    return [
        s.labels["source"]
        for f in text_string_to_metric_families(text)
        if f.name == "muster_metrics_source_up"
        for s in f.samples
        if s.value != 1.0
    ]


async def measure(settings: Settings, repeat: int) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name in SERVICES:
        server = MetricsServer(settings, *sources_of(name))
        url = await server.start()
        try:
            size = await scrape(url)  # the first: connects, plans
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                await scrape(url)
                times.append((time.perf_counter() - started) * 1000)
            down = sources_down((await server.render()).decode())
        finally:
            await server.close()
        out[name] = {
            "p50_ms": round(statistics.median(times), 1),
            "max_ms": round(max(times), 1),
            "bytes": size,
            "source_down": down,
        }
        print(
            f"{name:10s} scrape p50 {statistics.median(times):7.1f} ms, max {max(times):7.1f} ms,"
            f" {size} bytes, sources down: {down or 'none'}"
        )
    return out


async def run(args: argparse.Namespace, state: Path) -> dict[str, object]:
    nats = embedded.start_nats(state)
    pg = embedded.start_postgres(state / "pg", fast=True)
    try:
        url = embedded.create_database(pg.url, "muster")
        settings = Settings(nats_url=nats.url, database_url=url, state_dir=str(state))
        bus = await Bus.connect(nats.url, name="bench")
        await bus.ensure_streams()
        await bus.close()
        db = await asyncpg.connect(url)
        try:
            await migrate(db)
            counts = await fill(db, args.nodes, args.jobs)
            await db.execute("ANALYZE")
        finally:
            await db.close()
        scrapes = await measure(settings, args.repeat)
    finally:
        pg.stop()
        nats.stop()
    worst = max(float(str(s["p50_ms"])) for s in scrapes.values())
    return {
        "bench": "metrics_scrape",
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "jobs": args.jobs,
        **counts,
        "repeat": args.repeat,
        "worst_service_p50_ms": worst,
        "services": scrapes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="muster-bench-", ignore_cleanup_errors=True) as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        result = asyncio.run(run(args, state))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
