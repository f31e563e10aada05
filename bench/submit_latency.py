"""Submit-to-running latency on an idle local cluster.

Submits jobs one at a time (each to an idle cluster) and measures, from the database's
own clock, the time from the job's commit (`jobs.submitted_at`) to its workers running
on every node (`job_runs.started_at`, written once all agents report a started
process). Prints one line per percentile, then one JSON object; its `after_end` gives
the figures again by what had just happened, the time from the previous job's end
(its run's `ended_at`) to the submit: a tail that hid right after an end shows there.

    .venv/bin/python bench/submit_latency.py [--jobs 100] [--nodes 1 --gpus-per-node 1]
        [--gap-min 0.0 --gap-max 0.6] [--history 2000]

`--history N` first records N finished jobs (as a cluster that has run a while has):
the runtime predictor learns from the last 2,000.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
from collections.abc import Mapping
from pathlib import Path

import asyncpg
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import latency_figures, local_cluster, wait_for_nodes
from muster.client import call
from shared.api import SubmitReply, SubmitRequest
from shared.jobspec import JobSpec

SCRIPT = "#!/bin/bash\ntrue\n"


# the placer's leg is timed by the poll itself (the first poll that sees the allocation,
# on the database's clock: `allocations.created_at` is the start of a cycle's
# transaction, which may predate the submit it places); the rest is the launcher's
POLL = (
    "SELECT extract(epoch FROM r.started_at - j.submitted_at)::float8 AS s, r.state,"
    " extract(epoch FROM clock_timestamp() - j.submitted_at)::float8 AS t,"
    " EXISTS (SELECT 1 FROM allocations a WHERE a.job_id = j.job_id) AS placed"
    " FROM jobs j LEFT JOIN job_runs r USING (job_id) WHERE j.job_id = $1"
)


HISTORY_SPEC = JobSpec(
    user="root", account="default", partition="normal", script=SCRIPT, name="history",
    nodes_min=1, nodes_max=1, gpus_per_node=1, time_limit_s=3600,
)  # fmt: skip


async def seed_history(db: asyncpg.Connection, count: int) -> None:
    """`count` jobs that ran and ended, an hour ago and before, in 50 names, each with
    the allocation, node and GPU rows the placer keeps of it; then the
    vacuum and statistics autovacuum brings within its minute's nap on a cluster that
    gathered them over days (measured at once, the queue's index would still hold the
    `count` jobs that left it and every plan would be made without statistics)."""
    specs = [
        msgspec.json.encode(msgspec.structs.replace(HISTORY_SPEC, name=f"history{i % 50}"))
        for i in range(count)
    ]
    async with db.transaction():
        ids = await db.fetch(
            "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
            " gpus_per_node, time_limit_s, spec)"
            " SELECT 'history', 'root', 'default', 'normal', 'normal', 1, 1, 1, 3600, s"
            " FROM unnest($1::text[]::jsonb[]) AS s RETURNING job_id",
            [s.decode() for s in specs],
        )
        job_ids = [r["job_id"] for r in ids]
        await db.execute(
            "INSERT INTO job_runs(job_id, state, attempt, nodes, started_at, ended_at)"
            " SELECT id, 'COMPLETED', 1, ARRAY['node0' || (n % 2 + 1)],"
            " now() - make_interval(secs => 3700 + n), now() - make_interval(secs => 3600 + n)"
            " FROM unnest($1::bigint[]) WITH ORDINALITY AS x(id, n)",
            job_ids,
        )
        # the placer's record of each on this cluster's nodes (under its epoch, as the
        # fence wants): an allocation released, its node and GPU rows
        await db.execute(
            "WITH a AS (INSERT INTO allocations(job_id, attempt, epoch, released_at,"
            " release_reason) SELECT id, 1, (SELECT epoch FROM placer_lease WHERE id = 1),"
            " now() - make_interval(secs => 3600 + n),"
            " 'COMPLETED' FROM unnest($1::bigint[]) WITH ORDINALITY AS x(id, n)"
            " RETURNING alloc_id, job_id),"
            " n AS (INSERT INTO allocation_nodes(alloc_id, node, rank, gpus, live)"
            " SELECT alloc_id, 'node0' || (job_id % 2 + 1), 0, '{0}', false FROM a)"
            " INSERT INTO allocation_gpus(alloc_id, node, gpu, live)"
            " SELECT alloc_id, 'node0' || (job_id % 2 + 1), 0, false FROM a",
            job_ids,
        )
    await db.execute("VACUUM ANALYZE")


async def measure(
    nats_url: str,
    db_url: str,
    jobs: int,
    argv: tuple[str, ...],
    gap_s: tuple[float, float] = (0.0, 0.0),
    history: int = 0,
) -> tuple[list[float], list[float], list[float | None]]:
    """Each job is submitted once the one before has ended (its run no longer RUNNING),
    after a seeded random gap in `gap_s` (low, high): the moment right after a job ends is
    where a latency tail hid. Returns submit -> running and submit -> allocated (to
    5 ms, the poll period) and each submit's time after the previous job's end."""
    db = await asyncpg.connect(db_url)
    await wait_for_nodes(db, 2)
    await seed_history(db, history)
    gaps = random.Random(20)
    latencies, placed, ids = [], [], []
    for _ in range(jobs):
        req = SubmitRequest(user="root", script=SCRIPT, argv=argv)
        job_id = (await call(nats_url, "submit", req, SubmitReply)).job_ids[0]
        ids.append(job_id)
        seen: float | None = None
        while True:
            row = await db.fetchrow(POLL, job_id)
            assert row is not None  # the job was just submitted: its row exists
            if seen is None and row["placed"]:
                seen = row["t"]
            if row["s"] is not None and row["state"] not in ("RUNNING",):
                latencies.append(row["s"])
                placed.append(seen if seen is not None else row["s"])
                break
            if row["s"] is None and row["state"] not in (None, "STARTING", "RUNNING"):
                raise SystemExit(f"job {job_id} ended {row['state']} with no start recorded")
            if row["t"] > 60:
                raise SystemExit(f"job {job_id} not started and ended after 60 s: {dict(row)}")
            await asyncio.sleep(0.005)
        await asyncio.sleep(gaps.uniform(*gap_s))
    ends = await db.fetch(ENDS, ids)
    await db.close()
    return latencies, placed, since_previous_end(ids, {r["job_id"]: r for r in ends})


# Where in the previous job's end each submit fell: (label, upper bound in seconds).
AFTER_END = (("under_50ms", 0.05), ("50_200ms", 0.2), ("200ms_1s", 1.0), ("over_1s", None))

ENDS = (
    "SELECT j.job_id, extract(epoch FROM j.submitted_at)::float8 AS submitted,"
    " extract(epoch FROM r.ended_at)::float8 AS ended"
    " FROM jobs j JOIN job_runs r USING (job_id) WHERE j.job_id = ANY($1::bigint[])"
)


def since_previous_end(ids: list[int], rows: Mapping[int, asyncpg.Record]) -> list[float | None]:
    """Each job's submit less the previous job's end (None: the first job, or an end not
    recorded). Negative: submitted before the end was written (the poll saw COMPLETING)."""
    out: list[float | None] = [None]
    for before, job in itertools.pairwise(ids):
        ended = rows[before]["ended"] if before in rows else None
        out.append(None if ended is None else rows[job]["submitted"] - ended)
    return out


def by_after_end(lat: list[float], after: list[float | None]) -> dict[str, dict[str, object]]:
    """The figures of the jobs in each AFTER_END bucket (buckets with no job left out)."""
    buckets: dict[str, list[float]] = {label: [] for label, _ in AFTER_END}
    for s, a in zip(lat, after, strict=True):
        if a is not None:
            label = next(name for name, high in AFTER_END if high is None or a < high)
            buckets[label].append(s)
    return {label: latency_figures(label, mine) for label, mine in buckets.items() if mine}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=2, help="nodes per job (of 2)")
    parser.add_argument("--gpus-per-node", type=int, default=2, help="of 4")
    parser.add_argument("--gap-max", type=float, default=0.0, help="seconds after an end")
    parser.add_argument("--gap-min", type=float, default=0.0, help="at least this many")
    parser.add_argument("--replicas", type=int, default=1, help="of every service")
    parser.add_argument("--nats-servers", type=int, default=1, choices=(1, 3))
    parser.add_argument("--history", type=int, default=0, help="finished jobs recorded first")
    args = parser.parse_args()
    argv = (f"--nodes={args.nodes}", f"--gpus-per-node={args.gpus_per_node}")
    with local_cluster(2, replicas=args.replicas, nats_servers=args.nats_servers) as cluster:
        lat, placed, after = asyncio.run(
            measure(
                cluster.nats_url,
                cluster.database_url,
                args.jobs,
                argv,
                (args.gap_min, max(args.gap_min, args.gap_max)),
                args.history,
            )
        )
    leg = latency_figures("submit_to_allocated", placed)
    result = latency_figures("submit_to_running", lat, nodes_per_job=args.nodes)
    result["gpus_per_node"], result["gap_max_s"] = args.gpus_per_node, args.gap_max
    result["gap_min_s"] = args.gap_min
    result["replicas"], result["nats_servers"] = args.replicas, args.nats_servers
    result["history"] = args.history
    result["placer_p50_ms"], result["placer_p99_ms"] = leg["p50_ms"], leg["p99_ms"]
    result["over_100ms"] = sum(1 for s in lat if s > 0.1)
    result["after_end"] = by_after_end(lat, after)
    print(
        f"submit -> allocated over {len(placed)} jobs:"
        f" p50 {leg['p50_ms']} ms, p99 {leg['p99_ms']} ms, max {leg['max_ms']} ms"
    )
    print(
        f"submit -> running over {len(lat)} jobs:"
        f" p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, {result['over_100ms']} over 100 ms"
    )
    for label, figures in result["after_end"].items():  # type: ignore[attr-defined]
        print(f"  submitted {label} after the previous end: {figures}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
