"""Shell + pure helpers: the health monitor's metric sources (`shared/metrics.py`).

Nodes by state, GPUs by state (allocated, idle, unhealthy, drained) and partition, the
XIDs seen by xid and fault class, and how often the liveness judge changed hands. The
XID count is read from the `node.fault` events the monitor committed to the outbox
(the pruner keeps them, shared/retention.py), so it survives restarts of every process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily, Metric

from shared.db import Conn
from shared.metrics import gauge
from shared.states import NodeState

# A GPU's one state, first match wins: unhealthy, allocated (a live allocation holds
# it), drained (its node takes no new work: any state but UP), else idle.
GPU_STATE = """
WITH held AS (
  SELECT DISTINCT g.node, g.gpu FROM allocation_gpus g
    JOIN allocations a USING (alloc_id)
   WHERE g.live AND a.released_at IS NULL
), s AS (
  SELECT g.node,
         CASE WHEN NOT g.healthy THEN 'unhealthy'
              WHEN h.node IS NOT NULL THEN 'allocated'
              WHEN n.state <> 'UP' THEN 'drained'
              ELSE 'idle' END AS state
    FROM gpus g
    JOIN nodes n ON n.name = g.node
    LEFT JOIN held h ON h.node = g.node AND h.gpu = g.idx
)
"""
GPU_STATES = GPU_STATE + "SELECT s.node, s.state, count(*) AS n FROM s GROUP BY 1, 2"

PARTITIONS = "SELECT partition, nodes FROM partition_policy ORDER BY partition"

XIDS = """
SELECT (e->>'xid')::int AS xid, e->>'fault_class' AS fault_class, count(*) AS n
  FROM (SELECT convert_from(payload, 'UTF8')::jsonb AS e FROM outbox
         WHERE subject = 'muster.node.fault') f
 WHERE e->>'xid' IS NOT NULL
 GROUP BY 1, 2
"""

GPU_STATE_NAMES = ("allocated", "idle", "unhealthy", "drained")


def gpu_counts(
    per_node: Sequence[tuple[str, str, int]], partitions: Sequence[tuple[str, Sequence[str] | None]]
) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """(GPUs by state, GPUs by (partition, state)) from per-node counts (node, state, n).
    A GPU counts once in the first and in every partition its node is in (a partition
    without a node list has them all); no placement policy at all: one partition, ''."""
    whole: Counter[str] = Counter()
    by_partition: Counter[tuple[str, str]] = Counter()
    members = [(name, None if nodes is None else frozenset(nodes)) for name, nodes in partitions]
    for node, state, n in per_node:
        whole[state] += n
        for name, nodes in members or [("", None)]:
            if nodes is None or node in nodes:
                by_partition[name, state] += n
    return whole, by_partition


def node_counts(rows: list[tuple[str, int]]) -> list[tuple[tuple[str, ...], float]]:
    """Every node state with its count, zero included (a dashboard's series never vanish)."""
    seen = dict(rows)
    return [((s.value,), float(seen.get(s.value, 0))) for s in NodeState]


class NodesSource:
    name = "nodes"

    async def collect(self, conn: Conn) -> list[Metric]:
        nodes = await conn.fetch("SELECT state, count(*) AS n FROM nodes GROUP BY state")
        whole, counts = gpu_counts(
            [(r["node"], r["state"], r["n"]) for r in await conn.fetch(GPU_STATES)],
            [(r["partition"], r["nodes"]) for r in await conn.fetch(PARTITIONS)],
        )
        by_partition = [((p or "all", st), float(n)) for (p, st), n in counts.items()]
        return [
            gauge(
                "muster_nodes",
                "Nodes by state",
                ["state"],
                node_counts([(r["state"], r["n"]) for r in nodes]),
            ),
            gauge(
                "muster_gpus",
                "GPUs by state",
                ["state"],
                [((s,), float(whole.get(s, 0))) for s in GPU_STATE_NAMES],
            ),
            gauge(
                "muster_partition_gpus",
                "GPUs by state and partition (a GPU in two partitions counts in both;"
                " partition 'all' when there is no placement policy)",
                ["partition", "state"],
                sorted(by_partition),
            ),
        ]


class FaultsSource:
    name = "faults"

    async def collect(self, conn: Conn) -> list[Metric]:
        xids = CounterMetricFamily(
            "muster_xids", "GPU XIDs seen, by xid and fault class", labels=["xid", "fault_class"]
        )
        for r in await conn.fetch(XIDS):
            xids.add_metric([str(r["xid"]), r["fault_class"] or ""], float(r["n"]))
        faults = CounterMetricFamily(
            "muster_node_faults",
            "Faults recorded per node (XIDs and failed checks)",
            labels=["node"],
        )
        for r in await conn.fetch("SELECT name, fault_count FROM nodes WHERE fault_count > 0"):
            faults.add_metric([r["name"]], float(r["fault_count"]))
        leader = CounterMetricFamily(
            "muster_leader_changes",
            "Times a role's lease was taken (its fencing epoch)",
            labels=["role"],
        )
        epoch = await conn.fetchval("SELECT epoch FROM health_lease WHERE id = 1")
        leader.add_metric(["health"], float(epoch or 0))
        return [xids, faults, leader]


SOURCES = (NodesSource(), FaultsSource())
