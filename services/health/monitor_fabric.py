"""Health monitor, fabric faults: what a probe's `node.fabric_fault_observed` becomes
for the node state machine, and the `node.fault` a fabric transition owes (shell glue,
kept beside `monitor.py` so that file stays about one thing).

A fabric fault travels the XID's path: classified here (`catalog.classify_fabric`),
stepped by `monitor_core`, published as `node.fault` with the failed link named, so the
placer excludes the node and the launcher shrinks, swaps in a spare or requeues.
"""

from __future__ import annotations

from services.health import repo
from services.health.catalog import classify_fabric
from services.health.monitor_model import AnyObservation, FabricCleared, FabricFaultSeen, Transition
from shared.db import Conn
from shared.events import NodeFabricFaultObserved, NodeFault


def fabric_observation(obs: NodeFabricFaultObserved) -> AnyObservation:
    if obs.cleared:
        return FabricCleared(node=obs.node, link=obs.link, faulted=obs.faulted)
    verdict = classify_fabric(obs.link, obs.condition, obs.detail)
    return FabricFaultSeen(node=obs.node, classification=verdict, faulted=obs.faulted)


async def fabric_fault_event(
    conn: Conn, t: Transition, obs: NodeFabricFaultObserved | None
) -> NodeFault:
    c = t.fabric
    assert c is not None
    await repo.record_fault(
        conn,
        t.node,
        {
            "link": c.link,
            "class": str(c.fault_class),
            "condition": c.condition,
            "action": str(c.action),
            "description": c.detail,
            "at": obs.occurred_at.isoformat() if obs else None,
            "source": obs.source if obs else None,
            "state": str(t.to_state),
        },
    )
    return NodeFault(
        node=t.node,
        gpu=None,
        xid=None,
        fault_class=str(c.fault_class),
        action=str(c.action),
        severity=str(c.severity),
        excludes_node=c.excludes_node,
        affects_job=c.affects_job,
        link=c.link,
    )
