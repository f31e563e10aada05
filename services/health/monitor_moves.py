"""Pure: the moves of one node's state the monitor's core makes (see monitor_core):
where a node rests once heard, draining and drained, and the flap count that holds it."""

from __future__ import annotations

import msgspec

from services.health.monitor_model import (
    HealthPolicy,
    NodeHealth,
    Recovery,
    Transition,
    TransitionKind,
)
from shared.states import NodeState

CLEANING_REASON = "re-registered with workers running: waiting for the launcher to stop stale ones"
NodeResult = tuple[NodeHealth, list[Transition]]


def with_changes(node: NodeHealth, **changes: object) -> NodeHealth:
    return msgspec.structs.replace(node, **changes)


def move(node: NodeHealth, to: NodeState, reason: str, now: float) -> NodeHealth:
    since = node.since if node.state is to else now
    return with_changes(node, state=to, reason=reason, since=since)


def draining_or_drained(node: NodeHealth) -> NodeState:
    return NodeState.DRAINED if node.running == 0 else NodeState.DRAINING


def drained_if_idle(node: NodeHealth, now: float) -> NodeResult:
    if node.state is not NodeState.DRAINING or node.running != 0:
        return node, []
    moved = move(node, NodeState.DRAINED, node.reason, now)
    return moved, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_DRAINED,
            from_state=NodeState.DRAINING,
            to_state=NodeState.DRAINED,
            reason=node.reason,
        )
    ]


def rest_state(node: NodeHealth) -> NodeState:
    """Where the node's flags say it rests once it is heard."""
    if node.held or node.recovery is Recovery.REBOOT:
        return NodeState.FAILED
    if node.operator_drain or node.recovery in (Recovery.RESET, Recovery.FABRIC):
        return draining_or_drained(node)
    if node.clean_boot_id:
        return NodeState.CLEANING
    return NodeState.UP


def settle(node: NodeHealth, now: float, reason: str) -> NodeResult:
    """Move a node that may return to where its flags say it rests; UP is a recovery."""
    to = rest_state(node)
    before = node.state
    if to is before:
        return node, []
    if to is NodeState.CLEANING:
        reason = CLEANING_REASON
    elif to is not NodeState.UP:
        reason = node.reason
    node = move(node, to, reason, now)
    kind = {
        NodeState.UP: TransitionKind.NODE_RECOVERED,
        NodeState.DRAINED: TransitionKind.NODE_DRAINED,
        NodeState.DRAINING: TransitionKind.NODE_DRAINING,
        NodeState.CLEANING: TransitionKind.NODE_CLEANING,
    }.get(to, TransitionKind.NODE_HELD)
    return node, [
        Transition(node=node.name, kind=kind, from_state=before, to_state=to, reason=node.reason)
    ]


def count_failure(node: NodeHealth, now: float, p: HealthPolicy) -> NodeResult:
    """Record one failure; on the `flap_max`-th within the window, hold the node."""
    failures = (*(t for t in node.failures if now - t < p.flap_window_s), now)
    node = with_changes(node, failures=failures)
    if node.held or len(failures) < p.flap_max:
        return node, []
    reason = f"flapping: {len(failures)} failures in {p.flap_window_s:.0f}s; resume by hand"
    before = node.state
    node = with_changes(node, held=True)
    if before is not NodeState.DOWN:
        node = move(node, NodeState.FAILED, reason, now)
    else:
        node = with_changes(node, reason=reason)
    return node, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_HELD,
            from_state=before,
            to_state=node.state,
            reason=reason,
        )
    ]
