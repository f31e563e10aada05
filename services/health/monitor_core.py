"""Pure core of the cluster-side health monitor: the node state machine.

    step(state, observation, now) -> (state, transitions)

The states and the data are in `monitor_model`. Silence has two stages: a node unheard
for `heartbeat_timeout_s` is SUSPECT (no new work, its jobs kept), DOWN only after
`down_after_s` (its jobs restarted elsewhere); a heartbeat in between returns it with no
fault. No node is declared DOWN while the guard holds (`Guard`: the monitor's own bus is
down or just back, or many nodes fell silent at once).

A node returns to service only by a passing health check (`CheckPassed`, sent by the
probe after a reset or a reboot) when policy allows, or by an operator `OperatorResume`.
A fault that needs a reboot is only cleared by a check from a new boot. Held (flapping)
and operator-drained nodes ignore checks. A node that re-registers with workers still
running is CLEANING until the launcher has stopped the stale ones (`Cleaned`). Every
decision is a `Transition`: the event the shell publishes, with the reason as data.
"""

from __future__ import annotations

import msgspec

from services.health.catalog import Action, Classification, FabricAction
from services.health.monitor_model import (
    AnyObservation,
    CheckFailed,
    CheckPassed,
    Cleaned,
    ClusterHealth,
    FabricCleared,
    FabricFaultSeen,
    FaultSeen,
    GpuHealth,
    Guard,
    HealthPolicy,
    Heartbeat,
    Idle,
    NodeHealth,
    OperatorDrain,
    OperatorResume,
    Recovery,
    Tick,
    Transition,
    TransitionKind,
    WorkersFound,
)
from shared.states import NodeState

__all__ = [
    "AnyObservation",
    "CheckFailed",
    "CheckPassed",
    "Cleaned",
    "ClusterHealth",
    "FabricCleared",
    "FabricFaultSeen",
    "FaultSeen",
    "GpuHealth",
    "Guard",
    "HealthPolicy",
    "Heartbeat",
    "Idle",
    "NodeHealth",
    "NodeState",
    "OperatorDrain",
    "OperatorResume",
    "Recovery",
    "Tick",
    "Transition",
    "TransitionKind",
    "WorkersFound",
    "guard_for",
    "healthy_gpus",
    "in_service",
    "step",
]

# -- the step ----------------------------------------------------------------------------

CLEANING_REASON = "re-registered with workers running: waiting for the launcher to stop stale ones"

Result = tuple[ClusterHealth, tuple[Transition, ...]]
_NodeResult = tuple[NodeHealth, list[Transition]]


def step(state: ClusterHealth, obs: AnyObservation, now: float) -> Result:
    """Apply one observation at time `now`; return the new state and what to publish."""
    if isinstance(obs, Tick):
        return _tick(state, obs, now)
    node = state.nodes.get(obs.node) or NodeHealth(name=obs.node, since=now)
    p = state.policy
    match obs:
        case Heartbeat():
            new, out = _heartbeat(node, obs, now, p)
        case FaultSeen():
            new, out = _fault(node, obs, now, p)
        case FabricFaultSeen():
            new, out = _fabric_fault(node, obs, now, p)
        case FabricCleared():
            new, out = _fabric_cleared(node, obs, now, p)
        case CheckPassed():
            new, out = _check_passed(node, obs, now, p)
        case CheckFailed():
            new, out = _check_failed(node, obs, now, p)
        case WorkersFound():
            new, out = _workers_found(node, obs, now)
        case Cleaned():
            new, out = _cleaned(node, obs, now)
        case Idle():
            new, out = _drained_if_idle(_set(node, running=0), now)
        case OperatorDrain():
            new, out = _operator_drain(node, obs, now)
        case OperatorResume():
            new, out = _operator_resume(node, obs, now, p)
    nodes = dict(state.nodes)
    nodes[new.name] = new
    return ClusterHealth(policy=p, nodes=nodes, guard=state.guard), tuple(out)


def in_service(node: NodeHealth) -> bool:
    """Whether the placer may give the node new work."""
    return node.state is NodeState.UP


def healthy_gpus(node: NodeHealth) -> tuple[int, ...]:
    return tuple(g.index for g in node.gpus if g.healthy)


# -- handlers ----------------------------------------------------------------------------


def _heartbeat(node: NodeHealth, hb: Heartbeat, now: float, p: HealthPolicy) -> _NodeResult:
    gpus = node.gpus
    if hb.gpu_count is not None and len(gpus) != hb.gpu_count:
        known = {g.index: g for g in gpus}
        gpus = tuple(known.get(i, GpuHealth(index=i)) for i in range(hb.gpu_count))
    same_boot = not hb.boot_id or not node.boot_id or hb.boot_id == node.boot_id
    away = node.state in (NodeState.SUSPECT, NodeState.DOWN)
    # A node back from a new boot is alive, but only its registration's check (which
    # carries the boot) may return it: its heartbeats do not adopt the new boot.
    boot = node.boot_id if away and not same_boot else hb.boot_id or node.boot_id
    node = _set(node, last_heartbeat=now, running=hb.running, gpus=gpus, boot_id=boot)
    if node.state is NodeState.SUSPECT:
        # Silent, but not long enough to be DOWN: back where it was, no fault.
        return _settle(node, now, "heartbeat resumed") if same_boot else (node, [])
    if node.state is NodeState.DOWN:
        # Back after a silence. Same boot and no reboot owed: it only lost contact (a
        # reset still owed drains it, so the reset happens).
        if same_boot and node.recovery is not Recovery.REBOOT and p.auto_return:
            return _settle(node, now, "heartbeat resumed")
        return node, []
    return _drained_if_idle(node, now)


def _fault(node: NodeHealth, f: FaultSeen, now: float, p: HealthPolicy) -> _NodeResult:
    c = f.classification
    node = _set(node, gpus=_gpu_fault(node.gpus, f.gpu, c))
    if not (c.node_fault or c.affects_job or c.action is not Action.NONE):
        return node, []  # informational
    before = node.state
    reason = f"xid {c.xid} on gpu {f.gpu}: {c.description}"
    out: list[Transition] = []
    if c.action is Action.REBOOT_NODE:
        node = _set(node, recovery=Recovery.REBOOT, fault_boot_id=node.boot_id)
        if before is not NodeState.DOWN:
            node = _move(node, NodeState.FAILED, reason, now)
    elif c.excludes_node:
        if node.recovery is Recovery.NONE:
            node = _set(node, recovery=Recovery.RESET)
        if before in (NodeState.UP, NodeState.DRAINING):
            node = _move(node, _draining_or_drained(node), reason, now)
    fault = Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=before,
        to_state=node.state,
        reason=reason,
        gpu=f.gpu,
        classification=c,
    )
    if before is NodeState.UP and node.state is not NodeState.UP:
        node, out = _count_failure(node, now, p)
    return node, [fault, *out]


def _fabric_fault(node: NodeHealth, f: FabricFaultSeen, now: float, p: HealthPolicy) -> _NodeResult:
    """A link that cannot carry collectives drains the node (its jobs restart elsewhere,
    as for an XID) until the probe says the link is stable again; a lesser fault is
    published for the record and leaves the node where it is; a warning is nothing."""
    c = f.classification
    if c.action is FabricAction.WARN:
        return node, []
    before = node.state
    reason = f"network {c.condition} on {c.link}: {c.detail}".rstrip(": ")
    if c.excludes_node:
        if node.recovery is Recovery.NONE:
            node = _set(node, recovery=Recovery.FABRIC)
        if before in (NodeState.UP, NodeState.DRAINING):
            node = _move(node, _draining_or_drained(node), reason, now)
    fault = Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=before,
        to_state=node.state,
        reason=reason,
        fabric=c,
    )
    if before is NodeState.UP and node.state is not NodeState.UP:
        node, out = _count_failure(node, now, p)
        return node, [fault, *out]
    return node, [fault]


def _fabric_cleared(node: NodeHealth, c: FabricCleared, now: float, p: HealthPolicy) -> _NodeResult:
    if c.faulted or node.recovery is not Recovery.FABRIC:
        return node, []  # other links still at fault, or something else is owed
    node = _set(node, recovery=Recovery.NONE)
    if node.state is NodeState.UP or node.held or not p.auto_return:
        return node, []
    if node.state in (NodeState.DOWN, NodeState.SUSPECT):
        return node, []  # a heartbeat brings it back
    return _settle(node, now, f"fabric link {c.link} stable again")


def _gpu_fault(
    gpus: tuple[GpuHealth, ...], gpu: int | None, c: Classification
) -> tuple[GpuHealth, ...]:
    if gpu is None:
        return gpus
    known = {g.index: g for g in gpus}
    g = known.get(gpu, GpuHealth(index=gpu))
    known[gpu] = msgspec.structs.replace(
        g,
        last_xid=c.xid,
        healthy=g.healthy and not c.excludes_gpu,
        reset_pending=g.reset_pending or c.action is Action.RESET_GPU_AT_DRAIN,
    )
    return tuple(known[i] for i in sorted(known))


def _check_passed(node: NodeHealth, chk: CheckPassed, now: float, p: HealthPolicy) -> _NodeResult:
    boot = chk.boot_id or node.boot_id
    node = _set(node, boot_id=boot, last_heartbeat=now)
    if node.recovery is Recovery.REBOOT and boot and boot == node.fault_boot_id:
        return node, []  # a check from the boot that needed rebooting proves nothing
    gpus = tuple(
        GpuHealth(index=g.index, reset_pending=g.index in chk.reset_pending, last_xid=g.last_xid)
        for g in node.gpus
    )
    node = _set(node, recovery=Recovery.NONE, fault_boot_id="", gpus=gpus)
    if node.state is NodeState.DOWN and node.held:
        return _settle(node, now, "")  # alive again, but held: FAILED, not DOWN
    if node.state is NodeState.UP or node.held or not p.auto_return:
        return node, []
    return _settle(node, now, "health check passed")


def _check_failed(node: NodeHealth, chk: CheckFailed, now: float, p: HealthPolicy) -> _NodeResult:
    known = {g.index: g for g in node.gpus}
    for i in chk.unhealthy_gpus:
        known[i] = msgspec.structs.replace(known.get(i, GpuHealth(index=i)), healthy=False)
    node = _set(
        node, gpus=tuple(known[i] for i in sorted(known)), boot_id=chk.boot_id or node.boot_id
    )
    reason = "health check failed: " + "; ".join(chk.problems)
    if node.recovery is Recovery.NONE:
        node = _set(node, recovery=Recovery.RESET)  # owed wherever the node is now
    before = node.state
    if before not in (NodeState.UP, NodeState.CLEANING):
        return _set(node, reason=reason), []
    node = _move(node, _draining_or_drained(node), reason, now)
    fault = Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=before,
        to_state=node.state,
        reason=reason,
    )
    node, held = _count_failure(node, now, p)
    return node, [fault, *held]


def _workers_found(node: NodeHealth, found: WorkersFound, now: float) -> _NodeResult:
    """Workers still running at registration may belong to attempts the launcher has
    ended: the node takes no new work until the launcher has looked (invariant 7)."""
    if found.workers == 0:
        node = _set(node, clean_boot_id="")
        return _settle(node, now, "no stale workers") if _cleaning(node) else (node, [])
    boot = found.boot_id or node.boot_id or "unknown"
    node = _set(node, clean_boot_id=boot)
    if node.state is not NodeState.UP:
        return node, []  # where it rests after this (a check, a heartbeat) is CLEANING
    reason = f"{CLEANING_REASON} ({found.workers} reported)"
    node = _move(node, NodeState.CLEANING, reason, now)
    return node, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_CLEANING,
            from_state=NodeState.UP,
            to_state=NodeState.CLEANING,
            reason=reason,
        )
    ]


def _cleaned(node: NodeHealth, c: Cleaned, now: float) -> _NodeResult:
    if not node.clean_boot_id or (c.boot_id and c.boot_id != node.clean_boot_id):
        return node, []  # nothing owed, or the answer for an older boot
    node = _set(node, clean_boot_id="")
    return _settle(node, now, "stale workers stopped") if _cleaning(node) else (node, [])


def _cleaning(node: NodeHealth) -> bool:
    return node.state is NodeState.CLEANING


def _operator_drain(node: NodeHealth, op: OperatorDrain, now: float) -> _NodeResult:
    reason = f"drained by {op.by}: {op.reason}"
    node = _set(node, operator_drain=True)
    if node.state not in (NodeState.UP, NodeState.DRAINING):
        return _set(node, reason=reason), []
    before = node.state
    node = _move(node, _draining_or_drained(node), reason, now)
    kind = (
        TransitionKind.NODE_DRAINED
        if node.state is NodeState.DRAINED
        else TransitionKind.NODE_DRAINING
    )
    return node, [
        Transition(node=node.name, kind=kind, from_state=before, to_state=node.state, reason=reason)
    ]


def _operator_resume(
    node: NodeHealth, op: OperatorResume, now: float, p: HealthPolicy
) -> _NodeResult:
    reason = f"resumed by {op.by}" + (f": {op.reason}" if op.reason else "")
    gpus = tuple(msgspec.structs.replace(g, healthy=True) for g in node.gpus)
    node = _set(
        node,
        operator_drain=False,
        held=False,
        failures=(),
        recovery=Recovery.NONE,
        fault_boot_id="",
        gpus=gpus,
    )
    heard = node.last_heartbeat is not None and now - node.last_heartbeat <= p.heartbeat_timeout_s
    if node.state in (NodeState.DOWN, NodeState.SUSPECT) and not heard:
        return _set(node, reason=reason + " (still no heartbeat)"), []
    return _settle(node, now, reason)


def _tick(state: ClusterHealth, tick: Tick, now: float) -> Result:
    """Judge silence: SUSPECT past the timeout, DOWN past down_after_s unless the guard
    holds. Silence counts from the node's last heartbeat or our last (re)connect,
    whichever is later: no node is blamed for what we could not have heard."""
    p = state.policy
    if tick.connected_since is None:
        return ClusterHealth(policy=p, nodes=state.nodes, guard=Guard.BUS_DOWN), ()
    silence = {
        name: now - max(_heard(n), tick.connected_since)
        for name, n in state.nodes.items()
        if n.state is not NodeState.DOWN
    }
    silent = sorted(name for name, s in silence.items() if s > p.heartbeat_timeout_s)
    guard = guard_for(p, now - tick.connected_since, len(silent), len(silence))
    nodes = dict(state.nodes)
    out: list[Transition] = []
    for name in silent:
        nodes[name], moved = _silent(nodes[name], silence[name], guard, now, p)
        out.extend(moved)
    return ClusterHealth(policy=p, nodes=nodes, guard=guard), tuple(out)


def guard_for(p: HealthPolicy, connected_for: float, silent: int, live: int) -> Guard:
    """Whether DOWN is held back now, and why. Two or more nodes are needed for mass
    silence: one silent node among few is that node's fault, not an outage."""
    if connected_for < p.down_after_s:
        return Guard.BUS_GRACE
    if silent >= 2 and silent >= p.max_silent_share * live:
        return Guard.MASS_SILENCE
    return Guard.NONE


def _silent(
    node: NodeHealth, silence: float, guard: Guard, now: float, p: HealthPolicy
) -> _NodeResult:
    reason = f"no heartbeat for {silence:.1f}s"
    before = node.state
    if silence >= p.down_after_s and guard is Guard.NONE:
        counts = _rest(node) is NodeState.UP  # it was in service: a failure
        node = _move(node, NodeState.DOWN, reason, now)
        kind = TransitionKind.NODE_DOWN
    elif before is not NodeState.SUSPECT:
        counts = False
        node = _move(node, NodeState.SUSPECT, reason, now)
        kind = TransitionKind.NODE_SUSPECT
    else:
        return node, []
    moved = Transition(
        node=node.name, kind=kind, from_state=before, to_state=node.state, reason=reason
    )
    if not counts:
        return node, [moved]
    node, held = _count_failure(node, now, p)
    return node, [moved, *held]


def _heard(node: NodeHealth) -> float:
    return node.last_heartbeat if node.last_heartbeat is not None else node.since


# -- helpers -----------------------------------------------------------------------------


def _set(node: NodeHealth, **changes: object) -> NodeHealth:
    return msgspec.structs.replace(node, **changes)


def _move(node: NodeHealth, to: NodeState, reason: str, now: float) -> NodeHealth:
    since = node.since if node.state is to else now
    return _set(node, state=to, reason=reason, since=since)


def _draining_or_drained(node: NodeHealth) -> NodeState:
    return NodeState.DRAINED if node.running == 0 else NodeState.DRAINING


def _drained_if_idle(node: NodeHealth, now: float) -> _NodeResult:
    if node.state is not NodeState.DRAINING or node.running != 0:
        return node, []
    moved = _move(node, NodeState.DRAINED, node.reason, now)
    return moved, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_DRAINED,
            from_state=NodeState.DRAINING,
            to_state=NodeState.DRAINED,
            reason=node.reason,
        )
    ]


def _rest(node: NodeHealth) -> NodeState:
    """Where the node's flags say it rests once it is heard."""
    if node.held or node.recovery is Recovery.REBOOT:
        return NodeState.FAILED
    if node.operator_drain or node.recovery in (Recovery.RESET, Recovery.FABRIC):
        return _draining_or_drained(node)
    if node.clean_boot_id:
        return NodeState.CLEANING
    return NodeState.UP


def _settle(node: NodeHealth, now: float, reason: str) -> _NodeResult:
    """Move a node that may return to where its flags say it rests; UP is a recovery."""
    to = _rest(node)
    before = node.state
    if to is before:
        return node, []
    if to is NodeState.CLEANING:
        reason = CLEANING_REASON
    elif to is not NodeState.UP:
        reason = node.reason
    node = _move(node, to, reason, now)
    kind = {
        NodeState.UP: TransitionKind.NODE_RECOVERED,
        NodeState.DRAINED: TransitionKind.NODE_DRAINED,
        NodeState.DRAINING: TransitionKind.NODE_DRAINING,
        NodeState.CLEANING: TransitionKind.NODE_CLEANING,
    }.get(to, TransitionKind.NODE_HELD)
    return node, [
        Transition(node=node.name, kind=kind, from_state=before, to_state=to, reason=node.reason)
    ]


def _count_failure(node: NodeHealth, now: float, p: HealthPolicy) -> _NodeResult:
    """Record one failure; on the `flap_max`-th within the window, hold the node."""
    failures = (*(t for t in node.failures if now - t < p.flap_window_s), now)
    node = _set(node, failures=failures)
    if node.held or len(failures) < p.flap_max:
        return node, []
    reason = f"flapping: {len(failures)} failures in {p.flap_window_s:.0f}s; resume by hand"
    before = node.state
    node = _set(node, held=True)
    if before is not NodeState.DOWN:
        node = _move(node, NodeState.FAILED, reason, now)
    else:
        node = _set(node, reason=reason)
    return node, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_HELD,
            from_state=before,
            to_state=node.state,
            reason=reason,
        )
    ]
