"""The cluster's GPU time over a window (services/fairshare/cluster_report.py): the
hours' sums per state, their shares of what was reported, and the table."""

from __future__ import annotations

from services.fairshare.cluster_report import ClusterUsage, cluster_usage, render_cluster
from services.fairshare.report import TimeUnit
from shared.states import GpuTime

T0 = 1_800_000_000.0 // 3600 * 3600


def test_the_hours_sums_per_state_and_their_shares() -> None:
    usage = cluster_usage({GpuTime.ALLOCATED: 5400.0, GpuTime.IDLE: 1800.0, "DOWN": 0.0})
    assert usage == ClusterUsage(allocated_s=5400.0, idle_s=1800.0)
    assert usage.reported_s == 7200.0
    assert usage.share(usage.allocated_s) == 0.75
    assert ClusterUsage().share(0.0) == 0.0  # nothing reported: no share, no error


def test_the_table_says_the_window_the_unit_and_each_state() -> None:
    usage = ClusterUsage(allocated_s=5400.0, idle_s=1800.0, planned_down_s=3600.0)
    assert render_cluster(usage, T0, T0 + 3600, TimeUnit.HOURS).splitlines() == [
        "Cluster utilization 2027-01-15T08:00:00 - 2027-01-15T09:00:00 (UTC), GPU time in hours",
        "          Allocated   Idle Planned down  Down Reported",
        "--------- --------- ------ ------------ ----- --------",
        "GPU-hours      1.50   0.50         1.00  0.00     3.00",
        "share        50.00% 16.67%       33.33% 0.00%  100.00%",
    ]
