"""Pure core, data: what the job coordinator's decisions are made of.

The policy (`CoordinatorConfig`), the state of one running job (`JobRun`), what can
happen to it (observations), what the shell must do about it (actions) and the
`Decision` that carries both. Plain frozen values, so decisions compare whole in tests
and a `JobRun` round-trips through `job_runs.core`. The rules are in
`coordinator_core.py`, the clock arithmetic in `coordinator_timing.py`.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from services.launcher.exitstatus import ExitStatus
from shared.jobspec import JobSpec
from shared.signal_scope import SignalScope
from shared.states import JobState

# The placer answers a request for spares at once; without an answer by then (no placer
# leads, the request was dead-lettered) the job is requeued instead of waiting forever.
SPARE_WAIT_S = 30.0


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_restarts: int = 3  # fault-driven restarts/requeues; preemption does not count
    backoff_base_s: float = 1.0  # first fault restart is immediate, then base * 2**(n-1)
    backoff_max_s: float = 60.0
    kill_wait_s: float = 30.0  # SIGTERM -> SIGKILL at the time limit, cancel, failure
    restart_grace_s: float = 5.0  # SIGTERM -> SIGKILL when stopping to restart
    replace_with_spare: bool = True  # fixed-size job: ask the placer for a spare first
    # A GPU that dies often kills its process before the fault event arrives: a failed
    # worker fails the job only if no node of the job is reported lost within this.
    failure_settle_s: float = 2.0


class Phase(StrEnum):
    RUNNING = "running"
    SETTLING = "settling"  # a worker failed; waiting `failure_settle_s` for a node fault
    AWAITING_SPARE = "awaiting_spare"  # workers stopped; waiting for the placer's answer
    ENDED = "ended"  # finished or handed back to the queue: nothing more to decide


class Verdict(StrEnum):
    CONTINUE = "continue"  # state recorded, nothing to do
    IGNORE = "ignore"  # stale or irrelevant observation
    SIGNAL = "signal"
    COMPLETE = "complete"
    FAIL = "fail"
    SETTLE = "settle"  # a worker failed: fail after the settle time unless a node is lost
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    SHRINK = "shrink"
    GROW = "grow"
    REPLACE = "replace"  # asking the placer for spare nodes
    RESTART = "restart"  # spares granted: restart on survivors + spares
    REQUEUE = "requeue"
    PREEMPT = "preempt"  # preempted and not requeueable: ends PREEMPTED


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """How one generation ended (stored as `attempt` in rows written before the rename)."""

    generation: int = msgspec.field(name="attempt")
    nodes: tuple[str, ...]
    world_size: int
    started_at: float
    ended_at: float
    verdict: Verdict
    reason: str


class PendingFailure(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's failure, applied at `settle_at` unless a node is lost before."""

    node: str
    state: JobState
    reason: str
    exit_code: int | None = None
    signal: int | None = None
    settle_at: float


class JobRun(msgspec.Struct, frozen=True, kw_only=True):
    """A running job as the coordinator tracks it."""

    job_id: int
    spec: JobSpec
    # The generation now running (docs/launching.md, "Attempt, generation, restart
    # count"); stored as `attempt` in `job_runs.core`, its name before it was right.
    generation: int = msgspec.field(name="attempt")
    nodes: tuple[str, ...]  # this generation's nodes, in node-rank order
    started_at: float  # this generation's start
    limit_from: float  # the time limit counts from here (reset only by a requeue)
    restart_count: int = 0  # every restart and requeue: SLURM_RESTART_COUNT
    fault_restarts: int = 0  # the ones that count against max_restarts
    excluded_nodes: tuple[str, ...] = ()
    done_nodes: tuple[str, ...] = ()  # workers of this generation that exited 0
    signal_sent: bool = False
    phase: Phase = Phase.RUNNING
    spare_keep: tuple[str, ...] = ()  # survivors while awaiting spares
    spare_asked_at: float | None = None  # when the placer was asked (it answers at once)
    pending_failure: PendingFailure | None = None  # while SETTLING
    final_state: JobState | None = None
    history: tuple[AttemptRecord, ...] = ()


# Observations: what happened.
class Observation(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What happened to a run, as the core is told; one tagged union."""


class NodeFault(Observation, frozen=True, tag="node_fault"):
    node: str
    reason: str = "hardware fault"
    excludes_node: bool = True  # False: an application fault, the job's own bug


class NodeDown(Observation, frozen=True, tag="node_down"):
    node: str
    reason: str = "node unreachable"


class WorkerExited(Observation, frozen=True, tag="worker_exited"):
    node: str
    generation: int
    status: ExitStatus
    spawn_failed: str = ""
    lost: bool = False  # see shared.events.WorkerExited: a node failure, not the job's
    fenced: bool = False  # the same: the node fenced it, cut off from the control plane


class StepNodeLost(Observation, frozen=True, tag="step_node_lost"):
    """A task of one of the job's steps was fenced or lost on `node` (shared.events.
    JobNodeLost): the node failed the job, whatever its batch script does next."""

    node: str
    generation: int
    reason: str


class SignalDue(Observation, frozen=True, tag="signal_due"):
    """The `--signal` time before the limit has come."""


class SettleElapsed(Observation, frozen=True, tag="settle_elapsed"):
    """The wait after a fault for the other nodes' reports is over."""


class TimeLimitReached(Observation, frozen=True, tag="time_limit"):
    """The job's time limit has come."""


class Rearm(Observation, frozen=True, tag="rearm"):
    """The run's timers are to be read again: its time limit was changed (`muster
    update`), or a timer fell due that the current limit no longer makes due."""


class Preempt(Observation, frozen=True, tag="preempt"):
    grace_s: float


class Cancel(Observation, frozen=True, tag="cancel"):
    reason: str = "cancelled by user"
    exit_code: int | None = None  # released with its command's status (JobSelector's)


class RequeueAsked(Observation, frozen=True, tag="requeue_asked"):
    """`scontrol requeue`: its owner or an operator puts the running job back."""

    reason: str = "requeued by user"


class StartFailed(Observation, frozen=True, tag="start_failed"):
    """Some nodes could not start `generation`'s workers: the gang did not start.
    `unanswered`: those of `nodes` whose agent did not answer at all (restarting,
    paused, cut off), as opposed to one that answered with a refusal."""

    generation: int
    nodes: tuple[str, ...]
    reason: str
    unanswered: tuple[str, ...] = ()


class SparesGranted(Observation, frozen=True, tag="spares_granted"):
    nodes: tuple[str, ...]


class SparesDenied(Observation, frozen=True, tag="spares_denied"):
    """The placer had no spare node, or did not answer in time."""


class NodesAvailable(Observation, frozen=True, tag="nodes_available"):
    """The placer can give an elastic job these extra nodes (grow back)."""

    nodes: tuple[str, ...]


class AllocationGone(Observation, frozen=True, tag="allocation_gone"):
    """The reconcile found the run live but its allocation released: its GPUs may be
    someone else's already."""

    reason: str = "allocation released by the placer"


AnyObservation = (
    NodeFault
    | NodeDown
    | WorkerExited
    | StepNodeLost
    | SignalDue
    | SettleElapsed
    | TimeLimitReached
    | Rearm
    | Preempt
    | Cancel
    | RequeueAsked
    | StartFailed
    | SparesGranted
    | SparesDenied
    | NodesAvailable
    | AllocationGone
)


# Actions: what the shell must do, in order.
class Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """What the shell must do for a decision, in order; one tagged union."""


class SignalWorkers(Action, frozen=True, tag="signal"):
    nodes: tuple[str, ...]
    signal: int
    leader_only: bool = False  # `--signal=B:SIG`: the batch script only, not its group
    scope: SignalScope = SignalScope.WORKER  # the worker, or the tasks of the job's steps


class StopWorkers(Action, frozen=True, tag="stop"):
    """SIGTERM to each node's worker group, SIGKILL after `grace_s`; wait for all.

    `best_effort`: the node may be gone (node.down): ask it once, within a bounded
    time, and let nothing wait for its answer (the agent also fences itself)."""

    nodes: tuple[str, ...]
    grace_s: float
    best_effort: bool = False


class StartGeneration(Action, frozen=True, tag="start"):
    """Start `generation` on `nodes` (node-rank order) after `delay_s`: new placement,
    new master port, new rendezvous id."""

    generation: int
    nodes: tuple[str, ...]
    restart_count: int
    delay_s: float


class RequestSpares(Action, frozen=True, tag="request_spares"):
    count: int
    keep: tuple[str, ...]
    exclude: tuple[str, ...]


class Requeue(Action, frozen=True, tag="requeue"):
    restart_count: int
    excluded_nodes: tuple[str, ...]
    delay_s: float
    reason: str


class Finish(Action, frozen=True, tag="finish"):
    state: JobState
    reason: str
    exit_code: int | None = None
    signal: int | None = None


AnyAction = SignalWorkers | StopWorkers | StartGeneration | RequestSpares | Requeue | Finish


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    verdict: Verdict
    run: JobRun
    actions: tuple[AnyAction, ...] = ()


class Timers(msgspec.Struct, frozen=True, kw_only=True):
    """When the shell must deliver `SignalDue`, `SettleElapsed`, `TimeLimitReached`."""

    signal_at: float | None
    limit_at: float
    settle_at: float | None = None
    spare_deadline: float | None = None  # no answer by then: treated as denied
