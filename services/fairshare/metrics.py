"""Shell + pure helpers: the fair-share service's metric sources (`shared/metrics.py`).

Usage by account (GPU-seconds charged, a counter that lives in the `usage` table),
the decayed usage the priorities are computed from, each account's share of it, and
the fair-share factor its pending jobs have (`job_priorities`).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, Metric

from shared.db import Conn
from shared.metrics import gauge


def shares(decayed: Sequence[tuple[str, float]]) -> list[tuple[tuple[str, ...], float]]:
    """Each account's share (0..1) of the cluster's decayed usage; all 0 when none."""
    total = sum(max(v, 0.0) for _, v in decayed)
    return [((a,), (max(v, 0.0) / total) if total > 0 else 0.0) for a, v in decayed]


class UsageSource:
    name = "fairshare"

    async def collect(self, conn: Conn) -> list[Metric]:
        rows = await conn.fetch(
            "SELECT account, sum(gpu_seconds) AS used, sum(decayed) AS decayed, sum(billed) AS"
            " billed FROM usage GROUP BY account ORDER BY account"
        )
        used = CounterMetricFamily(
            "muster_fairshare_usage_gpu_seconds",
            "GPU-seconds charged, by account",
            labels=["account"],
        )
        billed = CounterMetricFamily(
            "muster_fairshare_billed",
            "Billing units charged (TRES-weighted), by account",
            labels=["account"],
        )
        for r in rows:
            used.add_metric([r["account"]], float(r["used"]))
            billed.add_metric([r["account"]], float(r["billed"]))
        decayed = [(r["account"], float(r["decayed"])) for r in rows]
        factors = await conn.fetch(
            "SELECT j.account, avg((p.factors->'factors'->>'fairshare')::float8) AS f"
            " FROM job_priorities p JOIN jobs j USING (job_id) GROUP BY 1 ORDER BY 1"
        )
        return [
            used,
            billed,
            gauge(
                "muster_fairshare_decayed_usage",
                "Decayed usage, by account",
                ["account"],
                [((a,), v) for a, v in decayed],
            ),
            gauge(
                "muster_fairshare_usage_share",
                "The account's share of the cluster's decayed usage (0..1)",
                ["account"],
                shares(decayed),
            ),
            gauge(
                "muster_fairshare_factor",
                "The fair-share factor (0..1) of the account's pending jobs, mean over them",
                ["account"],
                [((r["account"],), float(r["f"] or 0.0)) for r in factors],
            ),
        ]


SOURCES = (UsageSource(),)
