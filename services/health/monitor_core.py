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

from services.health.catalog import (
    Action,
    Classification,
    FabricAction,
    FabricClassification,
)
from services.health.monitor_links import excluded_by, shown, still_faulted
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
from services.health.monitor_moves import (
    CLEANING_REASON,
    NodeResult,
    count_failure,
    drained_if_idle,
    draining_or_drained,
    move,
    rest_state,
    settle,
    with_changes,
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


Result = tuple[ClusterHealth, tuple[Transition, ...]]


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
            new, out = drained_if_idle(with_changes(node, running=0), now)
        case OperatorDrain():
            new, out = _operator_drain(node, obs, now)
        case OperatorResume():
            new, out = _operator_resume(node, obs, now, p)
    nodes = dict(state.nodes)
    nodes[new.name] = shown(new)
    return ClusterHealth(policy=p, nodes=nodes, guard=state.guard), tuple(out)


def in_service(node: NodeHealth) -> bool:
    """Whether the placer may give the node new work."""
    return node.state is NodeState.UP


def healthy_gpus(node: NodeHealth) -> tuple[int, ...]:
    return tuple(g.index for g in node.gpus if g.healthy)


# -- handlers ----------------------------------------------------------------------------


def _heartbeat(node: NodeHealth, hb: Heartbeat, now: float, p: HealthPolicy) -> NodeResult:
    gpus = node.gpus
    if hb.gpu_count is not None and len(gpus) != hb.gpu_count:
        known = {g.index: g for g in gpus}
        gpus = tuple(known.get(i, GpuHealth(index=i)) for i in range(hb.gpu_count))
    same_boot = not hb.boot_id or not node.boot_id or hb.boot_id == node.boot_id
    away = node.state in (NodeState.SUSPECT, NodeState.DOWN)
    # A node back from a new boot is alive, but only its registration's check (which
    # carries the boot) may return it: its heartbeats do not adopt the new boot.
    boot = node.boot_id if away and not same_boot else hb.boot_id or node.boot_id
    node = with_changes(node, last_heartbeat=now, running=hb.running, gpus=gpus, boot_id=boot)
    if node.state is NodeState.SUSPECT:
        # Silent, but not long enough to be DOWN: back where it was, no fault.
        return settle(node, now, "heartbeat resumed") if same_boot else (node, [])
    if node.state is NodeState.DOWN:
        # Back after a silence. Same boot and no reboot owed: it only lost contact (a
        # reset still owed drains it, so the reset happens).
        if same_boot and node.recovery is not Recovery.REBOOT and p.auto_return:
            return settle(node, now, "heartbeat resumed")
        return node, []
    return drained_if_idle(node, now)


def _fault(node: NodeHealth, f: FaultSeen, now: float, p: HealthPolicy) -> NodeResult:
    c = f.classification
    node = with_changes(node, gpus=_gpu_fault(node.gpus, f.gpu, c))
    if not (c.node_fault or c.affects_job or c.action is not Action.NONE):
        return node, []  # informational
    before = node.state
    reason = f"xid {c.xid} on gpu {f.gpu}: {c.description}"
    if c.action is Action.REBOOT_NODE:
        node = with_changes(node, recovery=Recovery.REBOOT, fault_boot_id=node.boot_id)
        if before is not NodeState.DOWN:
            node = move(node, NodeState.FAILED, reason, now)
    elif c.excludes_node:
        node = _drain_for(node, Recovery.RESET, reason, now)
    fault = _fault_transition(node, before, reason, gpu=f.gpu, classification=c)
    return _counted(node, before, fault, now, p)


def _fabric_fault(node: NodeHealth, f: FabricFaultSeen, now: float, p: HealthPolicy) -> NodeResult:
    """A link that cannot carry collectives drains the node (its jobs restart elsewhere,
    as for an XID) until the probe says the link is stable again; a lesser fault keeps
    it out of multi-node jobs only (UP, its jobs untouched), published for the record;
    a warning is nothing."""
    c = f.classification
    if c.action is FabricAction.WARN:
        return node, []
    before = node.state
    reason = f"network {c.condition} on {c.link}: {c.detail}".rstrip(": ")
    if f.faulted:
        node = still_faulted(node, f.faulted)
    if c.action is FabricAction.EXCLUDE_MULTI_NODE:
        node = excluded_by(node, c)
    if c.excludes_node:
        node = _drain_for(node, Recovery.FABRIC, reason, now)
    return _counted(node, before, _fault_transition(node, before, reason, fabric=c), now, p)


def _drain_for(node: NodeHealth, owed: Recovery, reason: str, now: float) -> NodeHealth:
    """A fault that takes the node out until `owed` is done: drain it if in service."""
    if node.recovery is Recovery.NONE:
        node = with_changes(node, recovery=owed)
    if node.state in (NodeState.UP, NodeState.DRAINING):
        node = move(node, draining_or_drained(node), reason, now)
    return node


def _fault_transition(
    node: NodeHealth,
    before: NodeState,
    reason: str,
    *,
    gpu: int | None = None,
    classification: Classification | None = None,
    fabric: FabricClassification | None = None,
) -> Transition:
    return Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=before,
        to_state=node.state,
        reason=reason,
        gpu=gpu,
        classification=classification,
        fabric=fabric,
    )


def _counted(
    node: NodeHealth, before: NodeState, fault: Transition, now: float, p: HealthPolicy
) -> NodeResult:
    """`fault`, and one failure counted (a flapping node held) if it left service."""
    if before is NodeState.UP and node.state is not NodeState.UP:
        node, held = count_failure(node, now, p)
        return node, [fault, *held]
    return node, [fault]


def _fabric_cleared(node: NodeHealth, c: FabricCleared, now: float, p: HealthPolicy) -> NodeResult:
    node = still_faulted(node, c.faulted, c.link)  # its multi-node exclusion ends too
    if c.faulted or node.recovery is not Recovery.FABRIC:
        return node, []  # other links still at fault, or something else is owed
    node = with_changes(node, recovery=Recovery.NONE)
    if node.state is NodeState.UP or node.held or not p.auto_return:
        return node, []
    if node.state in (NodeState.DOWN, NodeState.SUSPECT):
        return node, []  # a heartbeat brings it back
    well = f"fabric link {c.link} stable again" if c.link else "fabric links well at agent start"
    return settle(node, now, well)


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


def _check_passed(node: NodeHealth, chk: CheckPassed, now: float, p: HealthPolicy) -> NodeResult:
    boot = chk.boot_id or node.boot_id
    node = with_changes(node, boot_id=boot, last_heartbeat=now)
    if node.recovery is Recovery.REBOOT and boot and boot == node.fault_boot_id:
        return node, []  # a check from the boot that needed rebooting proves nothing
    gpus = tuple(
        GpuHealth(index=g.index, reset_pending=g.index in chk.reset_pending, last_xid=g.last_xid)
        for g in node.gpus
    )
    node = with_changes(node, recovery=Recovery.NONE, fault_boot_id="", gpus=gpus)
    if node.state is NodeState.DOWN and node.held:
        return settle(node, now, "")  # alive again, but held: FAILED, not DOWN
    if node.state is NodeState.UP or node.held or not p.auto_return:
        return node, []
    return settle(node, now, "health check passed")


def _check_failed(node: NodeHealth, chk: CheckFailed, now: float, p: HealthPolicy) -> NodeResult:
    known = {g.index: g for g in node.gpus}
    for i in chk.unhealthy_gpus:
        known[i] = msgspec.structs.replace(known.get(i, GpuHealth(index=i)), healthy=False)
    node = with_changes(
        node, gpus=tuple(known[i] for i in sorted(known)), boot_id=chk.boot_id or node.boot_id
    )
    reason = "health check failed: " + "; ".join(chk.problems)
    if node.recovery is Recovery.NONE:
        node = with_changes(node, recovery=Recovery.RESET)  # owed wherever the node is now
    before = node.state
    if before not in (NodeState.UP, NodeState.CLEANING):
        return with_changes(node, reason=reason), []
    node = move(node, draining_or_drained(node), reason, now)
    fault = Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=before,
        to_state=node.state,
        reason=reason,
    )
    node, held = count_failure(node, now, p)
    return node, [fault, *held]


def _workers_found(node: NodeHealth, found: WorkersFound, now: float) -> NodeResult:
    """Workers still running at registration may belong to attempts the launcher has
    ended: the node takes no new work until the launcher has looked (invariant 7)."""
    if found.workers == 0:
        node = with_changes(node, clean_boot_id="")
        return settle(node, now, "no stale workers") if _cleaning(node) else (node, [])
    boot = found.boot_id or node.boot_id or "unknown"
    node = with_changes(node, clean_boot_id=boot)
    if node.state is not NodeState.UP:
        return node, []  # where it rests after this (a check, a heartbeat) is CLEANING
    reason = f"{CLEANING_REASON} ({found.workers} reported)"
    node = move(node, NodeState.CLEANING, reason, now)
    return node, [
        Transition(
            node=node.name,
            kind=TransitionKind.NODE_CLEANING,
            from_state=NodeState.UP,
            to_state=NodeState.CLEANING,
            reason=reason,
        )
    ]


def _cleaned(node: NodeHealth, c: Cleaned, now: float) -> NodeResult:
    if not node.clean_boot_id or (c.boot_id and c.boot_id != node.clean_boot_id):
        return node, []  # nothing owed, or the answer for an older boot
    node = with_changes(node, clean_boot_id="")
    return settle(node, now, "stale workers stopped") if _cleaning(node) else (node, [])


def _cleaning(node: NodeHealth) -> bool:
    return node.state is NodeState.CLEANING


def _operator_drain(node: NodeHealth, op: OperatorDrain, now: float) -> NodeResult:
    reason = f"drained by {op.by}: {op.reason}"
    node = with_changes(node, operator_drain=True)
    if node.state not in (NodeState.UP, NodeState.DRAINING):
        return with_changes(node, reason=reason), []
    before = node.state
    node = move(node, draining_or_drained(node), reason, now)
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
) -> NodeResult:
    reason = f"resumed by {op.by}" + (f": {op.reason}" if op.reason else "")
    gpus = tuple(msgspec.structs.replace(g, healthy=True) for g in node.gpus)
    node = with_changes(
        node,
        operator_drain=False,
        held=False,
        failures=(),
        recovery=Recovery.NONE,
        fault_boot_id="",
        gpus=gpus,
        multi_node_excluded={},
    )
    heard = node.last_heartbeat is not None and now - node.last_heartbeat <= p.heartbeat_timeout_s
    if node.state in (NodeState.DOWN, NodeState.SUSPECT) and not heard:
        return with_changes(node, reason=reason + " (still no heartbeat)"), []
    return settle(node, now, reason)


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
) -> NodeResult:
    reason = f"no heartbeat for {silence:.1f}s"
    before = node.state
    if silence >= p.down_after_s and guard is Guard.NONE:
        counts = rest_state(node) is NodeState.UP  # it was in service: a failure
        node = move(node, NodeState.DOWN, reason, now)
        kind = TransitionKind.NODE_DOWN
    elif before is not NodeState.SUSPECT:
        counts = False
        node = move(node, NodeState.SUSPECT, reason, now)
        kind = TransitionKind.NODE_SUSPECT
    else:
        return node, []
    moved = Transition(
        node=node.name, kind=kind, from_state=before, to_state=node.state, reason=reason
    )
    if not counts:
        return node, [moved]
    node, held = count_failure(node, now, p)
    return node, [moved, *held]


def _heard(node: NodeHealth) -> float:
    return node.last_heartbeat if node.last_heartbeat is not None else node.since
