"""Pure core: the job coordinator's decisions for one running job.

`decide(run, observation, config, now)` takes the job's state and one thing that
happened (a node fault, a worker exit, the time limit, a preemption, a cancel, ...) and
returns a `Decision`: the verdict, the job's next state and the actions the shell must
carry out, in order (stop workers, then start the next attempt / requeue / finish).
No I/O, no clock (`now` is passed in), so the same inputs always give the same decision.

Rules (docs/launching.md has the long form):
- gang: every worker exits 0 -> COMPLETED; any non-zero exit -> FAILED (the others are
  stopped); death by a signal -> FAILED with it; OOM -> OUT_OF_MEMORY;
- a lost node of an elastic job (nodes_min < nodes_max) with enough survivors: stop
  everywhere and restart on the survivors at the new world size (SHRINK); otherwise ask
  the placer for spares (REPLACE) when configured, else REQUEUE with the node excluded;
  fault restarts are limited (`max_restarts`) and delayed by exponential backoff;
- time limit -> TIMEOUT (SIGTERM, SIGKILL after `kill_wait_s`); `--signal=SIG@secs`
  sends SIG that long before the limit (see `timers`);
- preemption: SIGTERM, SIGKILL after the grace, REQUEUE (same id, restart_count + 1),
  or PREEMPTED when the job may not be requeued; cancel -> CANCELLED.
"""

from __future__ import annotations

import signal as _signal
from enum import StrEnum

import msgspec

from services.launcher.exitstatus import ExitStatus
from shared.jobspec import JobSpec


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    max_restarts: int = 3  # fault-driven restarts/requeues; preemption does not count
    backoff_base_s: float = 1.0  # first fault restart is immediate, then base * 2**(n-1)
    backoff_max_s: float = 60.0
    kill_wait_s: float = 30.0  # SIGTERM -> SIGKILL at the time limit, cancel, failure
    restart_grace_s: float = 5.0  # SIGTERM -> SIGKILL when stopping to restart
    replace_with_spare: bool = True  # fixed-size job: ask the placer for a spare first


class Phase(StrEnum):
    RUNNING = "running"
    AWAITING_SPARE = "awaiting_spare"  # workers stopped; waiting for the placer's answer
    ENDED = "ended"  # finished or handed back to the queue: nothing more to decide


class Verdict(StrEnum):
    CONTINUE = "continue"  # state recorded, nothing to do
    IGNORE = "ignore"  # stale or irrelevant observation
    SIGNAL = "signal"
    COMPLETE = "complete"
    FAIL = "fail"
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    SHRINK = "shrink"
    GROW = "grow"
    REPLACE = "replace"  # asking the placer for spare nodes
    RESTART = "restart"  # spares granted: restart on survivors + spares
    REQUEUE = "requeue"


class JobState(StrEnum):
    """Terminal states, named as Slurm names them."""

    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    CANCELLED = "CANCELLED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    attempt: int
    nodes: tuple[str, ...]
    world_size: int
    started_at: float
    ended_at: float
    verdict: Verdict
    reason: str


class JobRun(msgspec.Struct, frozen=True, kw_only=True):
    """A running job as the coordinator tracks it."""

    job_id: int
    spec: JobSpec
    attempt: int
    nodes: tuple[str, ...]  # this attempt's nodes, in node-rank order
    started_at: float  # this attempt's start
    limit_from: float  # the time limit counts from here (reset only by a requeue)
    restart_count: int = 0  # every restart and requeue: SLURM_RESTART_COUNT
    fault_restarts: int = 0  # the ones that count against max_restarts
    excluded_nodes: tuple[str, ...] = ()
    done_nodes: tuple[str, ...] = ()  # workers of this attempt that exited 0
    signal_sent: bool = False
    phase: Phase = Phase.RUNNING
    spare_keep: tuple[str, ...] = ()  # survivors while awaiting spares
    final_state: JobState | None = None
    history: tuple[AttemptRecord, ...] = ()


# Observations: what happened.
class Observation(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    pass


class NodeFault(Observation, frozen=True, tag="node_fault"):
    node: str
    reason: str = "hardware fault"
    excludes_node: bool = True  # False: an application fault, the job's own bug


class NodeDown(Observation, frozen=True, tag="node_down"):
    node: str
    reason: str = "node unreachable"


class WorkerExited(Observation, frozen=True, tag="worker_exited"):
    node: str
    attempt: int
    status: ExitStatus
    spawn_failed: str = ""


class SignalDue(Observation, frozen=True, tag="signal_due"):
    pass


class TimeLimitReached(Observation, frozen=True, tag="time_limit"):
    pass


class Preempt(Observation, frozen=True, tag="preempt"):
    grace_s: float


class Cancel(Observation, frozen=True, tag="cancel"):
    reason: str = "cancelled by user"


class SparesGranted(Observation, frozen=True, tag="spares_granted"):
    nodes: tuple[str, ...]


class SparesDenied(Observation, frozen=True, tag="spares_denied"):
    pass


class NodesAvailable(Observation, frozen=True, tag="nodes_available"):
    """The placer can give an elastic job these extra nodes (grow back)."""

    nodes: tuple[str, ...]


AnyObservation = (
    NodeFault
    | NodeDown
    | WorkerExited
    | SignalDue
    | TimeLimitReached
    | Preempt
    | Cancel
    | SparesGranted
    | SparesDenied
    | NodesAvailable
)


# Actions: what the shell must do, in order.
class Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    pass


class SignalWorkers(Action, frozen=True, tag="signal"):
    nodes: tuple[str, ...]
    signal: int
    leader_only: bool = False  # `--signal=B:SIG`: the batch script only, not its group


class StopWorkers(Action, frozen=True, tag="stop"):
    """SIGTERM to each node's worker group, SIGKILL after `grace_s`; wait for all."""

    nodes: tuple[str, ...]
    grace_s: float


class StartAttempt(Action, frozen=True, tag="start"):
    """Start `attempt` on `nodes` (node-rank order) after `delay_s`: new placement,
    new master port, new rendezvous id."""

    attempt: int
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


AnyAction = SignalWorkers | StopWorkers | StartAttempt | RequestSpares | Requeue | Finish


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    verdict: Verdict
    run: JobRun
    actions: tuple[AnyAction, ...] = ()


class Timers(msgspec.Struct, frozen=True, kw_only=True):
    """When the shell must deliver `SignalDue` and `TimeLimitReached`."""

    signal_at: float | None
    limit_at: float


def start_run(
    spec: JobSpec,
    *,
    job_id: int,
    nodes: tuple[str, ...],
    now: float,
    attempt: int = 0,
    restart_count: int = 0,
    excluded_nodes: tuple[str, ...] = (),
) -> JobRun:
    """The state of a job whose first (or requeued) attempt starts now on `nodes`."""
    return JobRun(
        job_id=job_id,
        spec=spec,
        attempt=attempt,
        nodes=nodes,
        started_at=now,
        limit_from=now,
        restart_count=restart_count,
        excluded_nodes=excluded_nodes,
    )


def timers(run: JobRun) -> Timers:
    limit_at = run.limit_from + run.spec.time_limit_s
    wants_signal = run.spec.signal is not None and not run.signal_sent
    signal_at = limit_at - run.spec.signal_before_s if wants_signal else None
    return Timers(signal_at=signal_at, limit_at=limit_at)


def parse_signal(name: str) -> int | None:
    """`USR1`, `SIGUSR1` or `10` -> 10; None for what is not a signal."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    try:
        return int(_signal.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except KeyError:
        return None


def world_size(spec: JobSpec, nnodes: int) -> int:
    """Worker processes of an attempt on `nnodes` nodes in the job's launch mode."""
    if not spec.torchrun:
        return nnodes
    return nnodes * (spec.gpus_per_node or spec.ntasks_per_node)


def backoff_s(fault_restarts: int, config: CoordinatorConfig) -> float:
    """Delay before fault restart number `fault_restarts` + 1: 0, base, 2*base, ..."""
    if fault_restarts == 0:
        return 0.0
    return float(min(config.backoff_max_s, config.backoff_base_s * 2 ** (fault_restarts - 1)))


def decide(
    run: JobRun, observation: AnyObservation, config: CoordinatorConfig, now: float
) -> Decision:
    """What to do about `observation` for `run`."""
    if run.phase is Phase.ENDED:
        return Decision(verdict=Verdict.IGNORE, run=run)
    match observation:
        case WorkerExited():
            return _on_worker_exited(run, observation, config, now)
        case NodeFault(excludes_node=False):
            if run.phase is not Phase.RUNNING or observation.node not in run.nodes:
                return Decision(verdict=Verdict.IGNORE, run=run)
            reason = f"application fault on {observation.node}: {observation.reason}"
            return _finish(run, Verdict.FAIL, JobState.FAILED, reason, config, now)
        case NodeFault() | NodeDown():
            reachable = isinstance(observation, NodeFault)
            return _on_node_lost(run, observation.node, observation.reason, reachable, config, now)
        case SparesGranted() | SparesDenied():
            return _on_spares(run, observation, config, now)
        case NodesAvailable():
            return _on_nodes_available(run, observation, config, now)
        case _:
            return _on_control(run, observation, config, now)


def _on_control(
    run: JobRun, obs: AnyObservation, config: CoordinatorConfig, now: float
) -> Decision:
    running = run.nodes if run.phase is Phase.RUNNING else ()
    match obs:
        case SignalDue():
            sig = parse_signal(run.spec.signal or "")
            if sig is None or run.signal_sent or not running:
                return Decision(verdict=Verdict.IGNORE, run=run)
            leader_only = run.spec.signal_batch_only
            act = SignalWorkers(nodes=_live(run), signal=sig, leader_only=leader_only)
            new = msgspec.structs.replace(run, signal_sent=True)
            return Decision(verdict=Verdict.SIGNAL, run=new, actions=(act,))
        case TimeLimitReached():
            reason = f"time limit of {run.spec.time_limit_s} s reached"
            return _finish(run, Verdict.TIMEOUT, JobState.TIMEOUT, reason, config, now)
        case Cancel():
            return _finish(run, Verdict.CANCEL, JobState.CANCELLED, obs.reason, config, now)
        case Preempt():
            return _on_preempt(run, obs, now)
    return Decision(verdict=Verdict.IGNORE, run=run)


def _live(run: JobRun) -> tuple[str, ...]:
    return tuple(n for n in run.nodes if n not in run.done_nodes)


def _stop(nodes: tuple[str, ...], grace_s: float) -> tuple[AnyAction, ...]:
    return (StopWorkers(nodes=nodes, grace_s=grace_s),) if nodes else ()


def _close(run: JobRun, verdict: Verdict, reason: str, now: float) -> tuple[AttemptRecord, ...]:
    record = AttemptRecord(
        attempt=run.attempt,
        nodes=run.nodes,
        world_size=world_size(run.spec, len(run.nodes)),
        started_at=run.started_at,
        ended_at=now,
        verdict=verdict,
        reason=reason,
    )
    return (*run.history, record)


def _finish(
    run: JobRun,
    verdict: Verdict,
    state: JobState,
    reason: str,
    config: CoordinatorConfig,
    now: float,
    *,
    status: ExitStatus | None = None,
    stop: tuple[str, ...] | None = None,
) -> Decision:
    to_stop = (_live(run) if run.phase is Phase.RUNNING else ()) if stop is None else stop
    history = _close(run, verdict, reason, now) if run.phase is Phase.RUNNING else run.history
    new = msgspec.structs.replace(run, phase=Phase.ENDED, final_state=state, history=history)
    finish = Finish(
        state=state,
        reason=reason,
        exit_code=status.exit_code if status else None,
        signal=status.signal if status else None,
    )
    return Decision(verdict=verdict, run=new, actions=(*_stop(to_stop, config.kill_wait_s), finish))


def _on_worker_exited(
    run: JobRun, obs: WorkerExited, config: CoordinatorConfig, now: float
) -> Decision:
    if run.phase is not Phase.RUNNING or obs.attempt != run.attempt or obs.node not in run.nodes:
        return Decision(verdict=Verdict.IGNORE, run=run)
    status = obs.status
    others = tuple(n for n in _live(run) if n != obs.node)
    if obs.spawn_failed:
        reason = f"worker on {obs.node} did not start: {obs.spawn_failed}"
        return _finish(run, Verdict.FAIL, JobState.FAILED, reason, config, now, stop=others)
    if status.oom_killed:
        reason = f"worker on {obs.node} ran out of memory"
        state = JobState.OUT_OF_MEMORY
        return _finish(run, Verdict.FAIL, state, reason, config, now, status=status, stop=others)
    if not status.ok:
        reason = f"worker on {obs.node} ended with {status.describe()}"
        state = JobState.FAILED
        return _finish(run, Verdict.FAIL, state, reason, config, now, status=status, stop=others)
    done = (*run.done_nodes, obs.node) if obs.node not in run.done_nodes else run.done_nodes
    new = msgspec.structs.replace(run, done_nodes=done)
    if set(done) >= set(run.nodes):
        reason = f"all {len(run.nodes)} workers exited 0"
        state = JobState.COMPLETED
        return _finish(new, Verdict.COMPLETE, state, reason, config, now, status=status, stop=())
    return Decision(verdict=Verdict.CONTINUE, run=new)


def _on_node_lost(
    run: JobRun, node: str, why: str, reachable: bool, config: CoordinatorConfig, now: float
) -> Decision:
    if run.phase is Phase.AWAITING_SPARE and node in run.spare_keep:
        keep = tuple(n for n in run.spare_keep if n != node)
        run = msgspec.structs.replace(run, spare_keep=keep)
        return _ask_spares(run, keep, _excluding(run, node), grace_s=0.0, stop=())
    if run.phase is not Phase.RUNNING or node not in run.nodes:
        return Decision(verdict=Verdict.IGNORE, run=run)
    reason = f"node {node} lost: {why}"
    survivors = tuple(n for n in run.nodes if n != node)
    stop = _live(run) if reachable else tuple(n for n in _live(run) if n != node)
    excluded = _excluding(run, node)
    if run.fault_restarts >= config.max_restarts:
        reason = f"{reason}; restart limit of {config.max_restarts} reached"
        return _finish(run, Verdict.FAIL, JobState.NODE_FAIL, reason, config, now, stop=stop)
    if _elastic(run.spec) and len(survivors) >= run.spec.nodes_min:
        return _restart(run, Verdict.SHRINK, survivors, excluded, reason, config, now, stop=stop)
    if config.replace_with_spare:
        closed = msgspec.structs.replace(
            run, history=_close(run, Verdict.REPLACE, reason, now), excluded_nodes=excluded
        )
        return _ask_spares(closed, survivors, excluded, grace_s=config.restart_grace_s, stop=stop)
    return _requeue_or_fail(run, excluded, reason, config, now, stop=stop)


def _excluding(run: JobRun, node: str) -> tuple[str, ...]:
    return run.excluded_nodes if node in run.excluded_nodes else (*run.excluded_nodes, node)


def _elastic(spec: JobSpec) -> bool:
    return spec.elastic or spec.nodes_min < spec.nodes_max


def _wanted(run: JobRun) -> int:
    """Nodes an attempt needs: at least nodes_min, the fixed size otherwise."""
    return run.spec.nodes_min if _elastic(run.spec) else run.spec.nodes_max


def _ask_spares(
    run: JobRun,
    keep: tuple[str, ...],
    excluded: tuple[str, ...],
    *,
    grace_s: float,
    stop: tuple[str, ...],
) -> Decision:
    count = max(1, _wanted(run) - len(keep))
    new = msgspec.structs.replace(
        run, phase=Phase.AWAITING_SPARE, spare_keep=keep, excluded_nodes=excluded
    )
    ask = RequestSpares(count=count, keep=keep, exclude=excluded)
    return Decision(verdict=Verdict.REPLACE, run=new, actions=(*_stop(stop, grace_s), ask))


def _restart(
    run: JobRun,
    verdict: Verdict,
    nodes: tuple[str, ...],
    excluded: tuple[str, ...],
    reason: str,
    config: CoordinatorConfig,
    now: float,
    *,
    stop: tuple[str, ...],
    fault: bool = True,
) -> Decision:
    history = _close(run, verdict, reason, now) if run.phase is Phase.RUNNING else run.history
    delay = backoff_s(run.fault_restarts, config) if fault else 0.0
    new = msgspec.structs.replace(
        run,
        attempt=run.attempt + 1,
        nodes=nodes,
        started_at=now + delay,
        restart_count=run.restart_count + 1,
        fault_restarts=run.fault_restarts + int(fault),
        excluded_nodes=excluded,
        done_nodes=(),
        phase=Phase.RUNNING,
        spare_keep=(),
        history=history,
    )
    start = StartAttempt(
        attempt=new.attempt, nodes=nodes, restart_count=new.restart_count, delay_s=delay
    )
    return Decision(verdict=verdict, run=new, actions=(*_stop(stop, config.restart_grace_s), start))


def _requeue_or_fail(
    run: JobRun,
    excluded: tuple[str, ...],
    reason: str,
    config: CoordinatorConfig,
    now: float,
    *,
    stop: tuple[str, ...],
) -> Decision:
    if not run.spec.requeue:
        return _finish(run, Verdict.FAIL, JobState.NODE_FAIL, reason, config, now, stop=stop)
    history = (
        _close(run, Verdict.REQUEUE, reason, now) if run.phase is Phase.RUNNING else run.history
    )
    delay = backoff_s(run.fault_restarts, config)
    new = msgspec.structs.replace(
        run,
        phase=Phase.ENDED,
        restart_count=run.restart_count + 1,
        fault_restarts=run.fault_restarts + 1,
        excluded_nodes=excluded,
        history=history,
    )
    requeue = Requeue(
        restart_count=new.restart_count, excluded_nodes=excluded, delay_s=delay, reason=reason
    )
    return Decision(
        verdict=Verdict.REQUEUE, run=new, actions=(*_stop(stop, config.restart_grace_s), requeue)
    )


def _on_spares(
    run: JobRun, obs: SparesGranted | SparesDenied, config: CoordinatorConfig, now: float
) -> Decision:
    if run.phase is not Phase.AWAITING_SPARE:
        return Decision(verdict=Verdict.IGNORE, run=run)
    if isinstance(obs, SparesDenied) or not obs.nodes:
        reason = "no spare node available"
        return _requeue_or_fail(run, run.excluded_nodes, reason, config, now, stop=())
    nodes = (*run.spare_keep, *obs.nodes)
    reason = f"replaced by {','.join(obs.nodes)}"
    return _restart(run, Verdict.RESTART, nodes, run.excluded_nodes, reason, config, now, stop=())


def _on_nodes_available(
    run: JobRun, obs: NodesAvailable, config: CoordinatorConfig, now: float
) -> Decision:
    room = run.spec.nodes_max - len(run.nodes)
    extra = tuple(n for n in obs.nodes if n not in run.nodes and n not in run.excluded_nodes)
    if run.phase is not Phase.RUNNING or not _elastic(run.spec) or room <= 0 or not extra:
        return Decision(verdict=Verdict.IGNORE, run=run)
    nodes = (*run.nodes, *extra[:room])
    reason = f"growing to {len(nodes)} nodes"
    return _restart(
        run,
        Verdict.GROW,
        nodes,
        run.excluded_nodes,
        reason,
        config,
        now,
        stop=_live(run),
        fault=False,
    )


def _on_preempt(run: JobRun, obs: Preempt, now: float) -> Decision:
    stop = _stop(_live(run) if run.phase is Phase.RUNNING else (), obs.grace_s)
    reason = "preempted"
    history = (
        _close(run, Verdict.REQUEUE, reason, now) if run.phase is Phase.RUNNING else run.history
    )
    if not run.spec.requeue:
        new = msgspec.structs.replace(
            run, phase=Phase.ENDED, final_state=JobState.PREEMPTED, history=history
        )
        finish = Finish(state=JobState.PREEMPTED, reason=reason)
        return Decision(verdict=Verdict.CANCEL, run=new, actions=(*stop, finish))
    new = msgspec.structs.replace(
        run, phase=Phase.ENDED, restart_count=run.restart_count + 1, history=history
    )
    requeue = Requeue(
        restart_count=new.restart_count,
        excluded_nodes=run.excluded_nodes,
        delay_s=0.0,
        reason=reason,
    )
    return Decision(verdict=Verdict.REQUEUE, run=new, actions=(*stop, requeue))
