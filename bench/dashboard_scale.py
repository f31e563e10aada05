"""Benchmark: the dashboard's data endpoints (and the page, in Chromium when there is one)
at 10,000 jobs and 1,000 nodes.

Starts embedded NATS and PostgreSQL, admission, fairshare and the gateway (no placer,
launcher or agents: the rows are inserted directly, so nothing moves while it measures),
inserts --nodes nodes x 8 GPUs and --jobs jobs (--running of them on 4 GPUs each with
live allocations, the rest pending with a reason; of the idle nodes every 10th failed by
an XID and every 15th drained), then times each endpoint uncached (the gateway's 1 s cache expired),
median of --repeat, and the page: the queue view until its rows show, the GPU map until
every node shows. Prints figures, then ONE JSON line. Usage:
    .venv/bin/python bench/dashboard_scale.py [--nodes 1000] [--jobs 10000] [--running 1500]
        [--screenshot docs/img/dashboard.png]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench._local import FAST, provision_identity
from muster.cluster import Cluster
from shared import embedded

GPUS = 8
CHROMIUM = os.environ.get("MUSTER_CHROMIUM", "/usr/bin/chromium")
SPEC = '{"user": "root", "script": "#!/bin/bash\\nsleep 1\\n", "name": "bench"}'


async def wait_tables(db: asyncpg.Connection) -> None:
    for _ in range(600):  # admission migrates as it starts
        try:
            await db.fetchval("SELECT count(*) FROM node_policy")
            return
        except asyncpg.UndefinedTableError:
            await asyncio.sleep(0.1)
    raise RuntimeError("admission did not create the tables")


async def fill(db: asyncpg.Connection, nodes: int, jobs: int, running: int) -> None:
    """`nodes` x 8 GPUs; `jobs` jobs, the first `running` holding 4 GPUs each."""
    names = [f"n{i:04d}" for i in range(nodes)]
    await db.copy_records_to_table(
        "nodes",
        records=[(n, "UP", [f"pod{i // 256}", f"leaf{i // 32}"]) for i, n in enumerate(names)],
        columns=["name", "state", "topology"],
    )
    await db.copy_records_to_table(
        "gpus",
        records=[(n, g, "SIM-H100") for n in names for g in range(GPUS)],
        columns=["node", "idx", "model"],
    )
    await db.copy_records_to_table(
        "jobs",
        records=[
            (
                f"job{j % 97}",
                f"user{j % 40}",
                f"acct{j % 8}",
                "normal",
                "normal",
                1,
                1,
                4,
                3600,
                SPEC,
            )
            for j in range(jobs)
        ],
        columns=[
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
        ],
    )
    await db.execute(
        "INSERT INTO placer_lease VALUES (1, 'bench', 1, now() + interval '1 day')"
        " ON CONFLICT (id) DO UPDATE SET epoch = 1, expires_at = now() + interval '1 day'"
    )
    ids = [r["job_id"] for r in await db.fetch("SELECT job_id FROM jobs ORDER BY job_id")]
    held = ids[:running]
    now = time.time()
    await db.copy_records_to_table(
        "job_runs",
        records=[(j, "RUNNING", 1, [names[(i * 4) // GPUS]]) for i, j in enumerate(held)],
        columns=["job_id", "state", "attempt", "nodes"],
    )
    await db.execute(
        "UPDATE job_runs SET started_at = to_timestamp($1) - (job_id % 7200) * interval '1 s'",
        now,
    )
    await db.executemany(
        "INSERT INTO allocations(job_id, attempt, epoch, created_at)"
        " VALUES ($1, 1, 1, to_timestamp($2))",
        [(j, now - (j % 7200)) for j in held],
    )
    allocs = await db.fetch("SELECT alloc_id, job_id FROM allocations ORDER BY job_id")
    gpu_rows = []
    for i, a in enumerate(allocs):
        node, first = names[(i * 4) // GPUS], (i * 4) % GPUS
        gpu_rows += [(a["alloc_id"], node, first + g) for g in range(4)]
    await db.copy_records_to_table(
        "allocation_gpus", records=gpu_rows, columns=["alloc_id", "node", "gpu"]
    )
    await db.copy_records_to_table(
        "pending_reasons",
        records=[(j, "Resources" if j % 3 else "Priority") for j in ids[running:]],
        columns=["job_id", "reason"],
    )
    # Faults as the map shows them: of the nodes without jobs, every 10th failed by an
    # XID on one GPU, every 15th (not failed) drained by an operator.
    free = range(-(-running * 4 // GPUS), nodes)
    for n, i in enumerate(free):
        if n % 10 == 3:
            await db.execute(
                "UPDATE nodes SET state = 'FAILED', reason = 'XID 79: GPU fell off the bus',"
                " last_fault = '{\"xid\": 79}'::jsonb WHERE name = $1",
                names[i],
            )
            await db.execute(
                "UPDATE gpus SET healthy = false, last_xid = 79 WHERE node = $1 AND idx = 3",
                names[i],
            )
        elif n % 15 == 7:
            await db.execute(
                "UPDATE nodes SET state = 'DRAINED', reason = 'maintenance' WHERE name = $1",
                names[i],
            )


async def timed(http: httpx.AsyncClient, path: str, repeat: int) -> tuple[float, int]:
    """Median seconds of `repeat` uncached GETs, and the answer's size in bytes."""
    times, size = [], 0
    for _ in range(repeat):
        await asyncio.sleep(1.1)  # past the gateway's shared cache
        t0 = time.perf_counter()
        r = await http.get(path)
        times.append(time.perf_counter() - t0)
        if r.status_code != 200:
            raise SystemExit(f"GET {path}: {r.status_code} {r.text[:500]}")
        size = len(r.content)
    return statistics.median(times), size


async def page_load(url: str, nodes: int, screenshot: str = "") -> dict[str, float]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {}
    if not os.path.exists(CHROMIUM):  # noqa: ASYNC240 (once, before any timing)
        return {}
    out = {}
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            for view, ready in (
                ("queue", "document.querySelectorAll('#queue-table tbody tr').length > 0"),
                ("gpus", f"document.querySelectorAll('[data-node]').length === {nodes}"),
            ):
                await asyncio.sleep(1.1)
                t0 = time.perf_counter()
                await page.goto(f"{url}/#{view}")
                await page.wait_for_function(ready, timeout=120_000)
                out[f"page_{view}_s"] = round(time.perf_counter() - t0, 3)
                if screenshot and view == "gpus":
                    await page.screenshot(path=screenshot)
        finally:
            await browser.close()
    return out


async def measure(c: Cluster, args: argparse.Namespace) -> dict[str, object]:
    db = await asyncpg.connect(c.database_url)
    try:
        await wait_tables(db)
        t0 = time.perf_counter()
        await fill(db, args.nodes, args.jobs, args.running)
        fill_s = time.perf_counter() - t0
    finally:
        await db.close()
    key = c.plan_gateway()
    c.specs[key].env["MUSTER_USER"] = "root"
    c.respawn(key)
    result: dict[str, object] = {
        "nodes": args.nodes,
        "gpus": args.nodes * GPUS,
        "jobs": args.jobs,
        "running": args.running,
        "fill_s": round(fill_s, 2),
    }
    async with httpx.AsyncClient(base_url=c.http, timeout=120) as http:
        for _ in range(600):  # the gateway is up once it answers; not yet: no connection
            with contextlib.suppress(httpx.TransportError):
                if (await http.get("/api/whoami")).status_code == 200:
                    break
            await asyncio.sleep(0.1)
        else:
            raise SystemExit(f"the gateway at {c.http} did not answer within 60 s")
        for name, path in (
            ("queue_page", "/api/queue?per_page=100"),
            ("queue_all_states_page", "/api/queue?all=1&per_page=100&page=50"),
            ("gpumap", "/api/gpumap?per_page=1000"),
            ("summary", "/api/gpumap?per_page=1"),
            ("job", "/api/jobs/1"),
            ("utilisation_6h", "/api/utilisation?hours=6"),
            ("share", "/api/share"),
            ("page_html", "/"),
        ):
            seconds, size = await timed(http, path, args.repeat)
            result[f"{name}_s"] = round(seconds, 3)
            result[f"{name}_bytes"] = size
            print(f"{name:24s} {seconds * 1000:8.1f} ms {size / 1024:9.1f} KiB", flush=True)
    browser = await page_load(c.http, args.nodes, args.screenshot)
    for k, v in browser.items():
        print(f"{k:24s} {v * 1000:8.1f} ms", flush=True)
    result.update(browser)
    result["chromium"] = bool(browser)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--screenshot", default="", help="save the GPU map as this PNG")
    args = parser.parse_args()
    if args.running * 4 > args.nodes * GPUS or args.running > args.jobs:
        parser.error("--running jobs of 4 GPUs must fit the nodes and the jobs")
    os.environ.update(FAST | {"MUSTER_LOG_LEVEL": "WARNING"})
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        nats = embedded.start_nats(state)
        pg = embedded.start_postgres(state, fast=True)
        c = Cluster(state, nats.url, embedded.create_database(pg.url, "muster"))
        try:
            provision_identity(state)
            for key in c.plan_services():
                if key in ("admission", "fairshare"):
                    c.respawn(key)
            result = asyncio.run(measure(c, args))
        finally:
            c.stop_all(timeout=10)
            nats.stop()
            pg.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
