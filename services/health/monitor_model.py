"""Pure data of the health monitor's state machine: node health, what the monitor
observes, and the transitions it decides (`monitor_core.step` is the logic).

States are `shared.states.NodeState` (the `nodes.state` column):

    UP        healthy, schedulable
    SUSPECT   silent for `heartbeat_timeout_s`: nothing new is placed, its jobs keep
              running; a heartbeat returns it where it was, with no fault
    CLEANING  re-registered while still running workers: out of service until the
              launcher has stopped the stale ones (`node.cleaned` for that boot)
    DRAINING  no new work; running work may finish (operator drain, or a fault that
              needs a GPU reset once the node is idle)
    DRAINED   no new work and idle: ready for the reset, maintenance, or resume
    DOWN      silent for `down_after_s`: its jobs are restarted elsewhere
    FAILED    needs a reboot, or flapped and is held until an operator resumes it
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from services.health.catalog import Classification, FabricClassification
from shared.states import NodeState


class Recovery(StrEnum):
    """What must happen before a check can bring the node back."""

    NONE = "none"
    RESET = "reset"  # a GPU reset (any check after it)
    REBOOT = "reboot"  # a reboot (a check from a new boot_id)
    FABRIC = "fabric"  # the probe says every faulted link is stable again (or a check)


class Guard(StrEnum):
    """Why no node may be declared DOWN right now (Kubernetes' unhealthy-zone rule): when
    many nodes fall silent at once, the fault is more likely ours or the network's than
    theirs, and restarting every job elsewhere would do more harm than waiting."""

    NONE = "none"
    BUS_DOWN = "bus_down"  # the monitor's own NATS connection is down: it hears no one
    BUS_GRACE = "bus_grace"  # connected less than down_after_s ago: agents still catching up
    MASS_SILENCE = "mass_silence"  # at least max_silent_share of the nodes are silent


class HealthPolicy(msgspec.Struct, frozen=True, kw_only=True):
    heartbeat_timeout_s: float = 10.0  # silent this long: SUSPECT
    down_after_s: float = 20.0  # silent this long: DOWN (unless the guard holds)
    max_silent_share: float = 0.5  # this share (and two or more) silent at once: guard
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
    # The boot that re-registered with workers still running: until the launcher says
    # it stopped the stale ones (node.cleaned), the node takes no new work.
    clean_boot_id: str = ""
    gpus: tuple[GpuHealth, ...] = ()
    # Links whose fabric fault keeps the node out of multi-node jobs (link -> what shows
    # it); the node stays UP for single-node work (monitor_links.py).
    multi_node_excluded: dict[str, str] = {}


class ClusterHealth(msgspec.Struct, frozen=True, kw_only=True):
    policy: HealthPolicy = HealthPolicy()
    nodes: dict[str, NodeHealth] = {}
    guard: Guard = Guard.NONE  # as the last Tick found it


# -- observations (a tagged union) -------------------------------------------------------


class Observation(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What the monitor core is told happened to a node; one tagged union."""


class Heartbeat(Observation, frozen=True, tag="heartbeat"):
    node: str
    boot_id: str = ""
    running: int | None = None  # jobs running on the node; 0 lets DRAINING finish
    gpu_count: int | None = None


class FaultSeen(Observation, frozen=True, tag="fault_seen"):
    node: str
    gpu: int | None
    classification: Classification


class FabricFaultSeen(Observation, frozen=True, tag="fabric_fault_seen"):
    node: str
    classification: FabricClassification
    faulted: tuple[str, ...] = ()  # every link the probe holds at fault, this one too


class FabricCleared(Observation, frozen=True, tag="fabric_cleared"):
    """`link` has been stable for the probe's stable period; `faulted`: the node's
    links still at fault after it (the node returns only when none is)."""

    node: str
    link: str
    faulted: tuple[str, ...] = ()


class CheckPassed(Observation, frozen=True, tag="check_passed"):
    node: str
    boot_id: str = ""
    reset_pending: tuple[int, ...] = ()  # GPUs still waiting for a reset (row remap)


class CheckFailed(Observation, frozen=True, tag="check_failed"):
    node: str
    boot_id: str = ""
    problems: tuple[str, ...] = ()
    unhealthy_gpus: tuple[int, ...] = ()


class WorkersFound(Observation, frozen=True, tag="workers_found"):
    """A registering agent listed the workers it still runs (0: none)."""

    node: str
    boot_id: str = ""
    workers: int = 0


class Cleaned(Observation, frozen=True, tag="cleaned"):
    """The launcher stopped the stale workers of `boot_id` ("" matches any boot)."""

    node: str
    boot_id: str = ""


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
    """Judge silence. `connected_since`: when the monitor's own NATS connection was last
    (re)established (its start counts); None while it is down. No node is blamed for
    silence the monitor could not have heard."""

    connected_since: float | None = 0.0


AnyObservation = (
    Heartbeat
    | FaultSeen
    | FabricFaultSeen
    | FabricCleared
    | CheckPassed
    | CheckFailed
    | WorkersFound
    | Cleaned
    | Idle
    | OperatorDrain
    | OperatorResume
    | Tick
)


# -- transitions -------------------------------------------------------------------------


class TransitionKind(StrEnum):
    NODE_FAULT = "node_fault"  # publish node.fault
    NODE_DOWN = "node_down"  # publish node.down
    NODE_RECOVERED = "node_recovered"  # publish node.recovered
    NODE_SUSPECT = "node_suspect"  # state only: no new work, jobs kept
    NODE_CLEANING = "node_cleaning"  # state only: waits for node.cleaned
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
    fabric: FabricClassification | None = None
