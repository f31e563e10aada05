"""Shell: the placer's metric sources (`shared/metrics.py`).

Leader changes (the lease's fencing epoch counts every takeover), allocations and
preemptions made, and the pending reasons the last cycle wrote, all from the tables.
The pass timings (seconds, jobs examined) are per-process histograms fed by the
`placer.cycle` span (`shared/telemetry.py: SpanMetrics`).
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, Metric

from shared.db import Conn
from shared.metrics import gauge


class PlacerSource:
    name = "placer"

    async def collect(self, conn: Conn) -> list[Metric]:
        epoch = await conn.fetchval("SELECT epoch FROM placer_lease WHERE id = 1")
        leader = CounterMetricFamily(
            "muster_leader_changes",
            "Times a role's lease was taken (its fencing epoch)",
            labels=["role"],
        )
        leader.add_metric(["placer"], float(epoch or 0))
        made = await conn.fetchval("SELECT count(*) FROM allocations")
        preempted = await conn.fetchval("SELECT count(*) FROM preemptions")
        reasons = await conn.fetch(
            "SELECT reason, count(*) AS n FROM pending_reasons GROUP BY reason ORDER BY reason"
        )
        allocations = CounterMetricFamily("muster_allocations", "Allocations the placer made")
        allocations.add_metric([], float(made))
        preemptions = CounterMetricFamily("muster_preemptions", "Preemptions the placer asked")
        preemptions.add_metric([], float(preempted))
        return [
            leader,
            allocations,
            preemptions,
            gauge(
                "muster_placer_waits",
                "Jobs by the wait reason the placer last wrote for them",
                ["reason"],
                [((r["reason"],), float(r["n"])) for r in reasons],
            ),
        ]


SOURCES = (PlacerSource(),)
