"""Shell + pure helpers: the admission service's metric sources (`shared/metrics.py`).

Jobs by state and partition, pending jobs by reason, the queue-wait histogram, the
outbox's lag and the bus's consumers and dead letters. Each is read from the tables (or
JetStream) at scrape time, so the counts survive any restart. A job's state is the one
rule `views.job_state` applies to a row; the query groups the jobs by every fact that
rule reads, so a scrape applies it once per group, not once per job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from prometheus_client.core import CounterMetricFamily, Metric

from services.admission.views import job_state
from shared.bus import DLQ_PREFIX, DLQ_STREAM, STREAM
from shared.db import Conn
from shared.metrics import cumulate, gauge, histogram
from shared.states import TERMINAL, JobState

# Queue waits run from seconds to days: the last finite bucket is a day.
WAIT_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 43200, 86400)

JOB_GROUPS = """
SELECT j.partition, r.state AS run_state, j.cancel_requested_at IS NOT NULL AS cancelled,
       live.job_id IS NOT NULL AS allocated, j.held, j.held_by_operator, j.needs_approval,
       j.approved_at IS NOT NULL AS approved, p.reason AS wait_reason, count(*) AS jobs
  FROM jobs j
  LEFT JOIN job_runs r USING (job_id)
  LEFT JOIN pending_reasons p USING (job_id)
  LEFT JOIN (SELECT DISTINCT a.job_id FROM allocations a
               JOIN allocation_nodes n ON n.alloc_id = a.alloc_id AND n.live
              WHERE a.released_at IS NULL) live USING (job_id)
 GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
"""

# A job's wait: from its submission to the start of its first attempt.
WAITS = """
WITH w AS (
  SELECT j.partition, extract(epoch FROM min(a.started_at) - j.submitted_at)::float8 AS s
    FROM jobs j JOIN attempts a USING (job_id)
   GROUP BY j.job_id
)
SELECT partition, width_bucket(s, $1::float8[]) AS bucket, count(*) AS n, sum(s) AS total
  FROM w GROUP BY 1, 2
"""


def count_jobs(
    groups: Iterable[Mapping[str, Any]],
) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """(jobs by (partition, state), pending jobs by (partition, reason)) of grouped rows."""
    states: Counter[tuple[str, str]] = Counter()
    pending: Counter[tuple[str, str]] = Counter()
    for g in groups:
        requeued = g["run_state"] == JobState.REQUEUED
        row = {
            # A requeued run shows PENDING like one never run; its reason is the queue's.
            "run_state": None if requeued else g["run_state"],
            "run_reason": "",
            "cancel_requested_at": True if g["cancelled"] else None,
            "cancel_reason": "",
            "alloc_nodes": ["?"] if g["allocated"] else None,
            "held": g["held"],
            "held_by_operator": g["held_by_operator"],
            "needs_approval": g["needs_approval"],
            "approved": g["approved"],
            "wait_reason": g["wait_reason"],
        }
        state, reason = job_state(row)
        states[g["partition"], state] += g["jobs"]
        if state == JobState.PENDING:
            pending[g["partition"], reason] += g["jobs"]
    return states, pending


class JobsSource:
    name = "jobs"

    async def collect(self, conn: Conn) -> list[Metric]:
        states, pending = count_jobs([dict(r) for r in await conn.fetch(JOB_GROUPS)])
        ended = CounterMetricFamily(
            "muster_jobs_ended", "Jobs that ended, by final state", labels=["partition", "state"]
        )
        for (partition, state), n in sorted(states.items()):
            if state in TERMINAL:
                ended.add_metric([partition, state], float(n))
        return [
            gauge(
                "muster_jobs",
                "Jobs by state and partition",
                ["partition", "state"],
                sorted(states.items()),
            ),
            gauge(
                "muster_jobs_pending",
                "Pending jobs by the reason they wait",
                ["partition", "reason"],
                sorted(pending.items()),
            ),
            ended,
        ]


class QueueWaitSource:
    name = "queue_wait"

    async def collect(self, conn: Conn) -> list[Metric]:
        rows = await conn.fetch(WAITS, [float(b) for b in WAIT_BUCKETS])
        data = cumulate(
            (((r["partition"],), r["bucket"], r["n"], r["total"]) for r in rows), WAIT_BUCKETS
        )
        return [
            histogram(
                "muster_queue_wait_seconds",
                "Time from submission to the first start of each job that started",
                ["partition"],
                WAIT_BUCKETS,
                data,
            )
        ]


class OutboxSource:
    name = "outbox"

    async def collect(self, conn: Conn) -> list[Metric]:
        row = await conn.fetchrow(
            "SELECT count(*) AS n, extract(epoch FROM now() - min(created_at))::float8 AS age"
            " FROM outbox WHERE published_at IS NULL"
        )
        assert row is not None
        return [
            gauge(
                "muster_outbox_unpublished_events",
                "Events committed, not yet published",
                [],
                [((), row["n"])],
            ),
            gauge(
                "muster_outbox_lag_seconds",
                "Age of the oldest unpublished event (0: none)",
                [],
                [((), row["age"] or 0.0)],
            ),
        ]


class BusSource:
    """The stream's durable consumers (deliveries, redeliveries in hand, backlog) and the
    dead letters kept per consumer: JetStream's own state, so they survive restarts."""

    name = "bus"

    async def collect(self, js: JetStreamContext) -> list[Metric]:
        consumers = await js.consumers_info(STREAM)
        delivered = CounterMetricFamily(
            "muster_bus_deliveries",
            "Deliveries by a durable consumer, redeliveries included",
            labels=["consumer"],
        )
        redelivered, pending, acking = [], [], []
        for c in consumers:
            name = c.name or c.config.durable_name or "?"
            delivered.add_metric(
                [name], float((c.delivered.consumer_seq or 0) if c.delivered else 0)
            )
            redelivered.append(((name,), float(c.num_redelivered or 0)))
            pending.append(((name,), float(c.num_pending or 0)))
            acking.append(((name,), float(c.num_ack_pending or 0)))
        try:
            dlq = await js.stream_info(DLQ_STREAM, subjects_filter=DLQ_PREFIX + ">")
            subjects = dlq.state.subjects or {}
        except NatsError:
            subjects = {}
        dead = CounterMetricFamily(
            "muster_bus_dead_letters", "Messages dead-lettered, by consumer", labels=["consumer"]
        )
        for subject, n in sorted(subjects.items()):
            dead.add_metric([subject.removeprefix(DLQ_PREFIX)], float(n))
        return [
            delivered,
            gauge(
                "muster_bus_redelivered_messages",
                "Messages in hand redelivered at least once",
                ["consumer"],
                redelivered,
            ),
            gauge(
                "muster_bus_pending_messages",
                "Messages not yet delivered to the consumer",
                ["consumer"],
                pending,
            ),
            gauge(
                "muster_bus_ack_pending_messages",
                "Messages delivered, not yet acknowledged",
                ["consumer"],
                acking,
            ),
            dead,
        ]


SOURCES = (JobsSource(), QueueWaitSource(), OutboxSource())
BUS_SOURCES = (BusSource(),)
