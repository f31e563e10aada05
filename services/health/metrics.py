"""Shell + pure helpers: the health monitor's metric sources (`shared/metrics.py`).

Nodes by state, GPUs by state (allocated, idle, unhealthy, drained) and partition, the
XIDs seen by xid and fault class, and how often the liveness judge changed hands. The
XID count is read from the `node.fault` events the monitor committed to the outbox
(kept, never pruned), so it survives restarts of every process.
"""

from __future__ import annotations

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
GPU_STATES = GPU_STATE + "SELECT s.state, count(*) AS n FROM s GROUP BY 1"
# A GPU counts in every partition its node is in (a partition without a node list has
# them all); no placement policy at all: one partition, ''.
GPU_PARTITIONS = (
    GPU_STATE
    + """
SELECT coalesce(p.partition, '') AS partition, s.state, count(*) AS n
  FROM s LEFT JOIN partition_policy p ON p.nodes IS NULL OR s.node = ANY(p.nodes)
 GROUP BY 1, 2
"""
)

XIDS = """
SELECT (e->>'xid')::int AS xid, e->>'fault_class' AS fault_class, count(*) AS n
  FROM (SELECT convert_from(payload, 'UTF8')::jsonb AS e FROM outbox
         WHERE subject = 'muster.node.fault') f
 WHERE e->>'xid' IS NOT NULL
 GROUP BY 1, 2
"""

GPU_STATE_NAMES = ("allocated", "idle", "unhealthy", "drained")


def node_counts(rows: list[tuple[str, int]]) -> list[tuple[tuple[str, ...], float]]:
    """Every node state with its count, zero included (a dashboard's series never vanish)."""
    seen = dict(rows)
    return [((s.value,), float(seen.get(s.value, 0))) for s in NodeState]


class NodesSource:
    name = "nodes"

    async def collect(self, conn: Conn) -> list[Metric]:
        nodes = await conn.fetch("SELECT state, count(*) AS n FROM nodes GROUP BY state")
        whole = {r["state"]: r["n"] for r in await conn.fetch(GPU_STATES)}
        by_partition = [
            ((r["partition"] or "all", r["state"]), float(r["n"]))
            for r in await conn.fetch(GPU_PARTITIONS)
        ]
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
