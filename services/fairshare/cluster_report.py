"""Pure core: the cluster's GPU time over a window (`muster report --cluster`, sreport's
`cluster Utilization`): how much of it the GPUs were allocated, idle, down for
maintenance (PLND Down) or down otherwise, from the hours the health monitor tallied
(`cluster_hours`, services/health/utilization.py). The window is whole hours, as for
the usage report (`report.window`). `reported_s` is every GPU-second counted: what the
monitor did not see (it was paused, PostgreSQL away) is in no state.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from services.fairshare.render import fmt_time, table
from services.fairshare.report import TimeUnit
from shared.states import GpuTime


class ClusterUsage(msgspec.Struct, frozen=True, kw_only=True):
    """GPU-seconds per state over the window; `reported_s` their sum."""

    allocated_s: float = 0.0
    idle_s: float = 0.0
    planned_down_s: float = 0.0
    down_s: float = 0.0

    @property
    def reported_s(self) -> float:
        return self.allocated_s + self.idle_s + self.planned_down_s + self.down_s

    def share(self, seconds: float) -> float:
        """Part of the reported GPU time (0 when none was)."""
        return seconds / self.reported_s if self.reported_s else 0.0


def cluster_usage(by_state: Mapping[str, float]) -> ClusterUsage:
    """The window's sums per `GpuTime` state, as the hours hold them."""
    return ClusterUsage(
        allocated_s=by_state.get(GpuTime.ALLOCATED, 0.0),
        idle_s=by_state.get(GpuTime.IDLE, 0.0),
        planned_down_s=by_state.get(GpuTime.PLANNED_DOWN, 0.0),
        down_s=by_state.get(GpuTime.DOWN, 0.0),
    )


COLUMNS = ("", "Allocated", "Idle", "Planned down", "Down", "Reported")


def render_cluster(
    usage: ClusterUsage, since: float, until: float, unit: TimeUnit = TimeUnit.HOURS
) -> str:
    """The window, then GPU time per state in `unit` and as a share of what was reported."""
    digits = 0 if unit is TimeUnit.SECONDS else 2
    values = (usage.allocated_s, usage.idle_s, usage.planned_down_s, usage.down_s)
    amounts = [f"{v / unit.seconds:.{digits}f}" for v in (*values, usage.reported_s)]
    shares = [f"{100 * usage.share(v):.2f}%" for v in (*values, usage.reported_s)]
    title = (
        f"Cluster utilization {fmt_time(since)} - {fmt_time(until)} (UTC), GPU time in {unit.value}"
    )
    body = [[f"GPU-{unit.value}", *amounts], ["share", *shares]]
    return title + "\n" + table(list(COLUMNS), body, left=1)
