"""Pure core of the cluster-side health monitor: the node state machine.

    step(state, observation, now) -> (state, transitions)

States (the `nodes.state` column):

    UP        healthy, schedulable
    DRAINING  no new work; running work may finish (operator drain, or a fault that
              needs a GPU reset once the node is idle)
    DRAINED   no new work and idle: ready for the reset, maintenance, or resume
    DOWN      no heartbeat for `heartbeat_timeout_s`
    FAILED    needs a reboot, or flapped (failed `flap_max` times within
              `flap_window_s`) and is held until an operator resumes it

A node returns to service only by a passing health check (`CheckPassed`, sent by the
probe after a reset or a reboot) when policy allows, or by an operator `OperatorResume`.
A fault that needs a reboot is only cleared by a check from a new boot. Held (flapping)
and operator-drained nodes ignore checks. Every decision is a `Transition`: the event
the shell publishes, with the reason as data.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from services.health.catalog import Action, Classification


class NodeState(StrEnum):
    UP = "UP"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    DOWN = "DOWN"
    FAILED = "FAILED"


class Recovery(StrEnum):
    """What must happen before a check can bring the node back."""

    NONE = "none"
    RESET = "reset"  # a GPU reset (any check after it)
    REBOOT = "reboot"  # a reboot (a check from a new boot_id)


class HealthPolicy(msgspec.Struct, frozen=True, kw_only=True):
    heartbeat_timeout_s: float = 10.0
    flap_window_s: float = 3600.0
    flap_max: int = 3  # this many failures within the window: held for an operator
    auto_return: bool = True  # a passing check returns a node to UP


class GpuHealth(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    healthy: bool = True
    reset_pending: bool = False  # healthy, but reset at the next drain (row remap)
    last_xid: int | None = None


class NodeHealth(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: NodeState = NodeState.UP
    reason: str = ""
    since: float = 0.0
    last_heartbeat: float | None = None
    boot_id: str = ""
    fault_boot_id: str = ""  # boot_id when a REBOOT recovery was required
    recovery: Recovery = Recovery.NONE
    operator_drain: bool = False
    held: bool = False  # flapped: only an operator resume brings it back
    failures: tuple[float, ...] = ()  # times of failures within the flap window
    running: int | None = None  # jobs running, when the heartbeat says
    gpus: tuple[GpuHealth, ...] = ()


class ClusterHealth(msgspec.Struct, frozen=True, kw_only=True):
    policy: HealthPolicy = HealthPolicy()
    nodes: dict[str, NodeHealth] = {}


# -- observations (a tagged union) -------------------------------------------------------


class Observation(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    pass


class Heartbeat(Observation, frozen=True, tag="heartbeat"):
    node: str
    boot_id: str = ""
    running: int | None = None  # jobs running on the node; 0 lets DRAINING finish
    gpu_count: int | None = None


class FaultSeen(Observation, frozen=True, tag="fault_seen"):
    node: str
    gpu: int | None
    classification: Classification


class CheckPassed(Observation, frozen=True, tag="check_passed"):
    node: str
    boot_id: str = ""
    reset_pending: tuple[int, ...] = ()  # GPUs still waiting for a reset (row remap)


class CheckFailed(Observation, frozen=True, tag="check_failed"):
    node: str
    problems: tuple[str, ...] = ()
    unhealthy_gpus: tuple[int, ...] = ()


class Idle(Observation, frozen=True, tag="idle"):
    node: str


class OperatorDrain(Observation, frozen=True, tag="operator_drain"):
    node: str
    by: str
    reason: str


class OperatorResume(Observation, frozen=True, tag="operator_resume"):
    node: str
    by: str
    reason: str = ""


class Tick(Observation, frozen=True, tag="tick"):
    pass


AnyObservation = (
    Heartbeat | FaultSeen | CheckPassed | CheckFailed | Idle | OperatorDrain | OperatorResume | Tick
)


# -- transitions -------------------------------------------------------------------------


class TransitionKind(StrEnum):
    NODE_FAULT = "node_fault"  # publish node.fault
    NODE_DOWN = "node_down"  # publish node.down
    NODE_RECOVERED = "node_recovered"  # publish node.recovered
    NODE_DRAINING = "node_draining"
    NODE_DRAINED = "node_drained"
    NODE_HELD = "node_held"  # flapped: held for an operator


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    kind: TransitionKind
    from_state: NodeState
    to_state: NodeState
    reason: str = ""
    gpu: int | None = None
    classification: Classification | None = None


# -- the step ----------------------------------------------------------------------------

Result = tuple[ClusterHealth, tuple[Transition, ...]]
_NodeResult = tuple[NodeHealth, list[Transition]]


def step(state: ClusterHealth, obs: AnyObservation, now: float) -> Result:
    """Apply one observation at time `now`; return the new state and what to publish."""
    if isinstance(obs, Tick):
        return _tick(state, now)
    node = state.nodes.get(obs.node) or NodeHealth(name=obs.node, since=now)
    p = state.policy
    match obs:
        case Heartbeat():
            new, out = _heartbeat(node, obs, now, p)
        case FaultSeen():
            new, out = _fault(node, obs, now, p)
        case CheckPassed():
            new, out = _check_passed(node, obs, now, p)
        case CheckFailed():
            new, out = _check_failed(node, obs, now, p)
        case Idle():
            new, out = _drained_if_idle(_set(node, running=0), now)
        case OperatorDrain():
            new, out = _operator_drain(node, obs, now)
        case OperatorResume():
            new, out = _operator_resume(node, obs, now, p)
    nodes = dict(state.nodes)
    nodes[new.name] = new
    return ClusterHealth(policy=p, nodes=nodes), tuple(out)


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
    node = _set(
        node,
        last_heartbeat=now,
        running=hb.running,
        gpus=gpus,
        boot_id=hb.boot_id or node.boot_id,
    )
    if node.state is NodeState.DOWN:
        # Back after a silence. Same boot and nothing owed: it only lost contact.
        if same_boot and node.recovery is Recovery.NONE and p.auto_return:
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
    node = _set(node, gpus=tuple(known[i] for i in sorted(known)))
    reason = "health check failed: " + "; ".join(chk.problems)
    if node.state is not NodeState.UP:
        return _set(node, reason=reason), []
    node = _set(node, recovery=Recovery.RESET)
    node = _move(node, _draining_or_drained(node), reason, now)
    fault = Transition(
        node=node.name,
        kind=TransitionKind.NODE_FAULT,
        from_state=NodeState.UP,
        to_state=node.state,
        reason=reason,
    )
    node, held = _count_failure(node, now, p)
    return node, [fault, *held]


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
    if node.state is NodeState.DOWN and not heard:
        return _set(node, reason=reason + " (still no heartbeat)"), []
    return _settle(node, now, reason)


def _tick(state: ClusterHealth, now: float) -> Result:
    p = state.policy
    nodes = dict(state.nodes)
    out: list[Transition] = []
    for name in sorted(nodes):
        node = nodes[name]
        heard = node.last_heartbeat if node.last_heartbeat is not None else node.since
        if node.state is NodeState.DOWN or now - heard <= p.heartbeat_timeout_s:
            continue
        before = node.state
        reason = f"no heartbeat for {now - heard:.1f}s"
        node = _move(node, NodeState.DOWN, reason, now)
        out.append(
            Transition(
                node=name,
                kind=TransitionKind.NODE_DOWN,
                from_state=before,
                to_state=node.state,
                reason=reason,
            )
        )
        if before is NodeState.UP:
            node, held = _count_failure(node, now, p)
            out.extend(held)
        nodes[name] = node
    return ClusterHealth(policy=p, nodes=nodes), tuple(out)


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


def _settle(node: NodeHealth, now: float, reason: str) -> _NodeResult:
    """Move a node that may return to where its flags say it rests; UP is a recovery."""
    if node.held or node.recovery is Recovery.REBOOT:
        to = NodeState.FAILED
    elif node.operator_drain or node.recovery is Recovery.RESET:
        to = _draining_or_drained(node)
    else:
        to = NodeState.UP
    before = node.state
    if to is before:
        return node, []
    node = _move(node, to, reason if to is NodeState.UP else node.reason, now)
    kind = {
        NodeState.UP: TransitionKind.NODE_RECOVERED,
        NodeState.DRAINED: TransitionKind.NODE_DRAINED,
        NodeState.DRAINING: TransitionKind.NODE_DRAINING,
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
