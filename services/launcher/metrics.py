"""Shell: the launcher's metric sources (`shared/metrics.py`).

Fault-to-restart seconds (from a `node.fault` naming a job to that job's next attempt
segment starting), restarts, shard ownership changes, and srun steps (running now, and
ended by state), all from the tables, so they survive restarts.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.launcher.steps_core import StepState
from shared.db import Conn
from shared.metrics import cumulate, histogram

RESTART_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)

# Each fault that named a job, and the first attempt segment of that job started after
# it: a restart in place, on a spare, or after a requeue alike.
FAULT_TO_RESTART = """
WITH f AS (
  SELECT (e->>'job_id')::bigint AS job_id, (e->>'occurred_at')::timestamptz AS at
    FROM (SELECT convert_from(payload, 'UTF8')::jsonb AS e FROM outbox
           WHERE subject = 'muster.node.fault') x
   WHERE e->>'job_id' IS NOT NULL
), r AS (
  SELECT extract(epoch FROM min(a.started_at) - f.at)::float8 AS s
    FROM f JOIN attempts a ON a.job_id = f.job_id AND a.started_at > f.at
   GROUP BY f.job_id, f.at
)
SELECT width_bucket(s, $1::float8[]) AS bucket, count(*) AS n, sum(s) AS total
  FROM r GROUP BY 1
"""


STEPS = "SELECT state, count(*) AS n FROM job_steps GROUP BY state"


class LauncherSource:
    name = "launcher"

    async def collect(self, conn: Conn) -> list[Metric]:
        rows = await conn.fetch(FAULT_TO_RESTART, [float(b) for b in RESTART_BUCKETS])
        data = cumulate((((), r["bucket"], r["n"], r["total"]) for r in rows), RESTART_BUCKETS)
        restarts = CounterMetricFamily("muster_job_restarts", "Restarts of jobs after failures")
        restarts.add_metric(
            [], float(await conn.fetchval("SELECT coalesce(sum(restart_count), 0) FROM job_runs"))
        )
        owners = CounterMetricFamily(
            "muster_ownership_changes",
            "Times a launcher shard was taken by a replica (the sum of the shards' epochs)",
        )
        owners.add_metric(
            [], float(await conn.fetchval("SELECT coalesce(sum(epoch), 0) FROM launcher_shards"))
        )
        steps = {r["state"]: int(r["n"]) for r in await conn.fetch(STEPS)}
        running = GaugeMetricFamily("muster_job_steps_running", "srun steps running now")
        running.add_metric([], float(steps.get(StepState.RUNNING, 0)))
        ended = CounterMetricFamily(
            "muster_job_steps_ended", "srun steps ended, by state", labels=["state"]
        )
        for state in StepState:
            if state is not StepState.RUNNING:  # every final state, zeros included
                ended.add_metric([state.value], float(steps.get(state, 0)))
        return [
            histogram(
                "muster_fault_to_restart_seconds",
                "Time from a fault that hit a job to the job's next start",
                [],
                RESTART_BUCKETS,
                data or {(): ([0] * (len(RESTART_BUCKETS) + 1), 0.0)},
            ),
            restarts,
            owners,
            running,
            ended,
        ]


SOURCES = (LauncherSource(),)
