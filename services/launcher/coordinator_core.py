"""Pure core: the job coordinator's decisions for one running job.

`decide(run, observation, config, now)` takes the job's state and one thing that
happened (a node fault, a worker exit, the time limit, a preemption, a cancel, ...) and
returns a `Decision`: the verdict, the job's next state and the actions the shell must
carry out, in order (stop workers, then start the next generation / requeue / finish).
No I/O, no clock (`now` is passed in), so the same inputs always give the same decision.
The values it works on are in `coordinator_model.py`, the timers in
`coordinator_timing.py`; both are re-exported here, so callers import one module.

Rules (docs/launching.md has the long form):
- gang: every worker exits 0 -> COMPLETED; any non-zero exit -> FAILED (the others are
  stopped); death by a signal -> FAILED with it; OOM -> OUT_OF_MEMORY; a failure waits
  `failure_settle_s` first, in case a node fault explains it (then it is a node loss);
- a lost node of an elastic job (nodes_min < nodes_max) with enough survivors: stop
  everywhere and restart on the survivors at the new world size (SHRINK); otherwise ask
  the placer for spares (REPLACE) when configured, else REQUEUE with the node excluded;
  fault restarts are limited (`max_restarts`) and delayed by exponential backoff; a node
  that is down is still asked, best effort, to stop its worker;
- time limit -> TIMEOUT (SIGTERM, SIGKILL after `kill_wait_s`); `--signal=SIG@secs`
  sends SIG that long before the limit (see `timers`); a limit changed while the job
  runs (`muster update --time`) re-arms the timers from the job's new spec (`Rearm`,
  CONTINUE: only the due time changes) or, already past, is the limit reached;
- gang start: a node that refuses to start its worker -> stop the ones that did, REQUEUE
  with that node excluded (counted like a fault); one that does not answer is stopped
  too but not excluded (health takes a silent node out of placement);
- preemption: SIGTERM, SIGKILL after the grace, REQUEUE (same id, restart_count + 1),
  or PREEMPTED when the job may not be requeued; cancel -> CANCELLED; an allocation
  released under a live run -> stop at once and REQUEUE (not counted), else FAILED.
"""

from __future__ import annotations

import msgspec

from services.launcher.coordinator_model import (
    SPARE_WAIT_S,
    Action,
    AllocationGone,
    AnyAction,
    AnyObservation,
    AttemptRecord,
    Cancel,
    CoordinatorConfig,
    Decision,
    Finish,
    JobRun,
    NodeDown,
    NodeFault,
    NodesAvailable,
    Observation,
    PendingFailure,
    Phase,
    Preempt,
    Rearm,
    RequestSpares,
    Requeue,
    RequeueAsked,
    SettleElapsed,
    SignalDue,
    SignalWorkers,
    SparesDenied,
    SparesGranted,
    StartFailed,
    StartGeneration,
    StepNodeLost,
    StopWorkers,
    TimeLimitReached,
    Timers,
    Verdict,
    WorkerExited,
)
from services.launcher.coordinator_timing import (
    backoff_s,
    due_at,
    due_observation,
    due_or_rearm,
    parse_signal,
    start_run,
    timers,
    world_size,
)
from services.launcher.exitstatus import ExitStatus
from shared.jobspec import JobSpec
from shared.signal_scope import SignalScope
from shared.states import JobState

__all__ = [
    "SPARE_WAIT_S", "Action", "AllocationGone", "AnyAction", "AnyObservation", "AttemptRecord",
    "Cancel", "CoordinatorConfig", "Decision", "Finish", "JobRun", "JobState", "NodeDown",
    "NodeFault", "NodesAvailable", "Observation", "PendingFailure", "Phase", "Preempt", "Rearm",
    "RequestSpares", "Requeue", "RequeueAsked", "SettleElapsed", "SignalDue", "SignalWorkers",
    "SparesDenied", "SparesGranted", "StartFailed", "StartGeneration", "StepNodeLost",
    "StopWorkers", "TimeLimitReached", "Timers", "Verdict", "WorkerExited", "backoff_s",
    "decide", "due_at", "due_observation", "due_or_rearm", "parse_signal", "signal_targets",
    "start_run", "timers", "world_size",
]  # fmt: skip


def decide(
    run: JobRun, observation: AnyObservation, config: CoordinatorConfig, now: float
) -> Decision:
    """What to do about `observation` for `run`."""
    if run.phase is Phase.ENDED:
        return Decision(verdict=Verdict.IGNORE, run=run)
    return _Decider(run, config, now).on(observation)


# How an application fault's end reads ("application fault on node01: xid 13 ..."): its
# own failure, not a node's (chaos reports tell it from the failures nobody meant).
APP_FAULT = "application fault on "


def signal_targets(
    spec: JobSpec,
    nodes: tuple[str, ...],
    sig: int,
    scope: SignalScope | None,
    leader_only: bool = False,
) -> tuple[SignalWorkers, ...]:
    """Where a signal that stops nothing goes (`scancel -s`, `--signal=SIG@T`), as Slurm
    sends it. A job whose worker is its work (`muster submit`, torchrun): the workers.
    An sbatch job (its script on the first node, its work in srun steps): by default
    the steps' tasks on every node (`scope` None or STEPS); WORKER (`scancel -b`,
    `--signal=B:`) the script on the first node; FULL both. Its other nodes' workers
    only hold the allocation and are never signalled."""
    if not spec.batch_first_node:
        return (SignalWorkers(nodes=nodes, signal=sig, leader_only=leader_only),)
    scope = scope or SignalScope.STEPS
    script = SignalWorkers(nodes=nodes[:1], signal=sig, leader_only=leader_only)
    steps = SignalWorkers(nodes=nodes, signal=sig, scope=SignalScope.STEPS)
    return {
        SignalScope.WORKER: (script,),
        SignalScope.STEPS: (steps,),
        SignalScope.FULL: (script, steps),
    }[scope]


def _excluding(excluded: tuple[str, ...], node: str) -> tuple[str, ...]:
    return excluded if node in excluded else (*excluded, node)


def _elastic(spec: JobSpec) -> bool:
    return spec.elastic or spec.nodes_min < spec.nodes_max


def _stop(nodes: tuple[str, ...], grace_s: float) -> tuple[AnyAction, ...]:
    return (StopWorkers(nodes=nodes, grace_s=grace_s),) if nodes else ()


class _Decider:
    """One decision: `run`, `config` and `now` held so each rule reads as a sentence.
    Pure: it only builds values."""

    def __init__(self, run: JobRun, config: CoordinatorConfig, now: float) -> None:
        self.run, self.config, self.now = run, config, now
        self.running = run.phase in (Phase.RUNNING, Phase.SETTLING)
        self.live = tuple(n for n in run.nodes if n not in run.done_nodes) if self.running else ()

    def on(self, obs: AnyObservation) -> Decision:
        match obs:
            case WorkerExited():
                return self.worker_exited(obs)
            case StepNodeLost() if obs.generation == self.run.generation:
                return self.node_lost(obs.node, obs.reason, reachable=True, exclude=False)
            case NodeFault(excludes_node=False) if obs.node in self.live:
                reason = f"{APP_FAULT}{obs.node}: {obs.reason}"
                return self.finish(Verdict.FAIL, JobState.FAILED, reason)
            case NodeFault(excludes_node=True):
                return self.node_lost(obs.node, obs.reason, reachable=True)
            case NodeDown():
                return self.node_down(obs)
            case AllocationGone():
                return self.allocation_gone(obs)
            case SparesGranted() | SparesDenied():
                return self.spares(obs)
            case NodesAvailable():
                return self.nodes_available(obs)
            case SignalDue():
                return self.signal_due()
            case SettleElapsed():
                return self.settle_elapsed()
            case TimeLimitReached():
                reason = f"time limit of {self.run.spec.time_limit_s} s reached"
                return self.finish(Verdict.TIMEOUT, JobState.TIMEOUT, reason)
            case Rearm():  # the due time is written again from the run's spec
                return Decision(verdict=Verdict.CONTINUE, run=self.run)
            case Cancel(exit_code=None):
                return self.finish(Verdict.CANCEL, JobState.CANCELLED, obs.reason)
            case Cancel(exit_code=int(code)):
                return self.released(code, obs.reason)
            case Preempt():
                return self.preempt(obs)
            case RequeueAsked():
                return self.requeue_asked(obs)
            case StartFailed():
                return self.start_failed(obs)
        return self.ignore()

    def ignore(self) -> Decision:
        return Decision(verdict=Verdict.IGNORE, run=self.run)

    def history(self, verdict: Verdict, reason: str) -> tuple[AttemptRecord, ...]:
        """The history with this generation closed, if it was still open."""
        run = self.run
        if not self.running:
            return run.history
        record = AttemptRecord(
            generation=run.generation, nodes=run.nodes,
            world_size=world_size(run.spec, len(run.nodes)), started_at=run.started_at,
            ended_at=self.now, verdict=verdict, reason=reason,
        )  # fmt: skip
        return (*run.history, record)

    def finish(
        self, verdict: Verdict, state: JobState, reason: str, *, status: ExitStatus | None = None,
        stop: tuple[str, ...] | None = None,
    ) -> Decision:  # fmt: skip
        new = msgspec.structs.replace(
            self.run, phase=Phase.ENDED, final_state=state, history=self.history(verdict, reason)
        )
        code, sig = (status.exit_code, status.signal) if status else (None, None)
        finish = Finish(state=state, reason=reason, exit_code=code, signal=sig)
        stopping = _stop(self.live if stop is None else stop, self.config.kill_wait_s)
        return Decision(verdict=verdict, run=new, actions=(*stopping, finish))

    def released(self, code: int, reason: str) -> Decision:
        """Its holder let the allocation go with its command's status (salloc, an srun
        that made it): the job ends as that command did, its workers stopped."""
        status = ExitStatus(exit_code=code)
        if code == 0:
            return self.finish(Verdict.COMPLETE, JobState.COMPLETED, reason, status=status)
        return self.finish(Verdict.FAIL, JobState.FAILED, reason, status=status)

    def worker_exited(self, obs: WorkerExited) -> Decision:
        run, status = self.run, obs.status
        if obs.generation != run.generation or obs.node not in self.live:
            return self.ignore()
        others = tuple(n for n in self.live if n != obs.node)
        who = f"worker on {obs.node}"
        if obs.lost or obs.fenced:  # the node crashed, rebooted or was cut off under
            # it: restarted as for a node fault; not excluded, as its agent is back (it
            # reported this); the restart limit bounds a node that keeps failing
            why = (
                f"its worker was lost ({status.describe()}, no exit recorded)"
                if obs.lost
                else "its worker was fenced (the node lost the control plane)"
            )
            return self.node_lost(obs.node, why, reachable=True, exclude=False)
        if obs.spawn_failed:
            reason = f"{who} did not start: {obs.spawn_failed}"
            return self.finish(Verdict.FAIL, JobState.FAILED, reason, stop=others)
        if not status.ok:
            state = JobState.OUT_OF_MEMORY if status.oom_killed else JobState.FAILED
            reason = f"{who} ended with {status.describe()}"
            return self.worker_failed(obs.node, state, reason, status)
        if run.spec.batch_first_node and obs.node == run.nodes[0]:
            reason = f"the batch script on {obs.node} exited 0"
            return self.finish(
                Verdict.COMPLETE, JobState.COMPLETED, reason, status=status, stop=others
            )
        self.run = msgspec.structs.replace(run, done_nodes=(*run.done_nodes, obs.node))
        if others:
            return Decision(verdict=Verdict.CONTINUE, run=self.run)
        reason = f"all {len(run.nodes)} workers exited 0"
        return self.finish(Verdict.COMPLETE, JobState.COMPLETED, reason, status=status, stop=())

    def worker_failed(
        self, node: str, state: JobState, reason: str, status: ExitStatus
    ) -> Decision:
        """Fail now, or first wait `failure_settle_s` for a node loss that explains it."""
        if self.run.phase is Phase.SETTLING:
            return self.ignore()  # the first failure is the one reported
        settle_s = self.config.failure_settle_s
        if settle_s <= 0:
            others = tuple(n for n in self.live if n != node)
            return self.finish(Verdict.FAIL, state, reason, status=status, stop=others)
        failure = PendingFailure(
            node=node, state=state, reason=reason, exit_code=status.exit_code, signal=status.signal,
            settle_at=self.now + settle_s,
        )  # fmt: skip
        new = msgspec.structs.replace(self.run, phase=Phase.SETTLING, pending_failure=failure)
        return Decision(verdict=Verdict.SETTLE, run=new)

    def settle_elapsed(self) -> Decision:
        failure = self.run.pending_failure
        if self.run.phase is not Phase.SETTLING or failure is None:
            return self.ignore()
        status = ExitStatus(exit_code=failure.exit_code, signal=failure.signal)
        others = tuple(n for n in self.live if n != failure.node)
        return self.finish(Verdict.FAIL, failure.state, failure.reason, status=status, stop=others)

    def node_down(self, obs: NodeDown) -> Decision:
        """A node that stopped answering is lost like a faulty one; nothing waits on its
        agent, but it is still asked to stop the job's workers, should it be alive
        behind a partition (it also fences itself after `fence_s`)."""
        decision = self.node_lost(obs.node, obs.reason, reachable=False)
        if decision.verdict is Verdict.IGNORE or obs.node not in self.live:
            return decision
        ask = StopWorkers(nodes=(obs.node,), grace_s=self.config.restart_grace_s, best_effort=True)
        return msgspec.structs.replace(decision, actions=(ask, *decision.actions))

    def allocation_gone(self, obs: AllocationGone) -> Decision:
        """The placer released the run's GPUs under it: stop at once; back to the queue
        (not counted, no backoff: the job did nothing wrong), else FAILED."""
        if not self.running:
            return self.ignore()
        if not self.run.spec.requeue:
            return self.finish(Verdict.FAIL, JobState.FAILED, obs.reason, stop=self.live)
        new = msgspec.structs.replace(
            self.run, phase=Phase.ENDED, restart_count=self.run.restart_count + 1,
            history=self.history(Verdict.REQUEUE, obs.reason),
        )  # fmt: skip
        requeue = Requeue(
            restart_count=new.restart_count, excluded_nodes=self.run.excluded_nodes, delay_s=0.0,
            reason=obs.reason,
        )  # fmt: skip
        stopping = _stop(self.live, self.config.restart_grace_s)
        return Decision(verdict=Verdict.REQUEUE, run=new, actions=(*stopping, requeue))

    def node_lost(self, node: str, why: str, *, reachable: bool, exclude: bool = True) -> Decision:
        run, config = self.run, self.config
        if run.phase is Phase.AWAITING_SPARE and node in run.spare_keep:
            keep = tuple(n for n in run.spare_keep if n != node)
            return self.ask_spares(keep, _excluding(run.excluded_nodes, node), stop=())
        if not self.running or node not in run.nodes:
            return self.ignore()
        reason = f"node {node} lost: {why}"
        survivors = tuple(n for n in run.nodes if n != node)
        stop = self.live if reachable else tuple(n for n in self.live if n != node)
        if exclude:
            self.run = run = msgspec.structs.replace(
                run, excluded_nodes=_excluding(run.excluded_nodes, node)
            )
        if run.fault_restarts >= config.max_restarts:
            reason = f"{reason}; restart limit of {config.max_restarts} reached"
            return self.finish(Verdict.FAIL, JobState.NODE_FAIL, reason, stop=stop)
        if _elastic(run.spec) and len(survivors) >= run.spec.nodes_min:
            return self.restart(Verdict.SHRINK, survivors, reason, stop=stop)
        if config.replace_with_spare:
            self.run = msgspec.structs.replace(run, history=self.history(Verdict.REPLACE, reason))
            return self.ask_spares(survivors, run.excluded_nodes, stop=stop)
        return self.requeue(reason, stop=stop)

    def ask_spares(
        self, keep: tuple[str, ...], excluded: tuple[str, ...], *, stop: tuple[str, ...]
    ) -> Decision:
        spec = self.run.spec
        wanted = spec.nodes_min if _elastic(spec) else spec.nodes_max
        new = msgspec.structs.replace(
            self.run, phase=Phase.AWAITING_SPARE, spare_keep=keep, excluded_nodes=excluded,
            pending_failure=None, spare_asked_at=self.now,
        )  # fmt: skip
        ask = RequestSpares(count=max(1, wanted - len(keep)), keep=keep, exclude=excluded)
        stopping = _stop(stop, self.config.restart_grace_s)
        return Decision(verdict=Verdict.REPLACE, run=new, actions=(*stopping, ask))

    def spares(self, obs: SparesGranted | SparesDenied) -> Decision:
        run = self.run
        if run.phase is not Phase.AWAITING_SPARE:
            return self.ignore()
        if isinstance(obs, SparesDenied) or not obs.nodes:
            return self.requeue("no spare node available", stop=())
        reason = f"replaced by {','.join(obs.nodes)}"
        return self.restart(Verdict.RESTART, (*run.spare_keep, *obs.nodes), reason, stop=())

    def nodes_available(self, obs: NodesAvailable) -> Decision:
        run = self.run
        room = run.spec.nodes_max - len(run.nodes)
        # The placer granted these under the job's exclusions; a node excluded after a
        # fault that has since passed its health check is welcome back.
        extra = [n for n in obs.nodes if n not in run.nodes]
        if not self.running or not _elastic(run.spec) or room <= 0 or not extra:
            return self.ignore()
        nodes = (*run.nodes, *extra[:room])
        reason = f"growing to {len(nodes)} nodes"
        return self.restart(Verdict.GROW, nodes, reason, stop=self.live, fault=False)

    def restart(
        self, verdict: Verdict, nodes: tuple[str, ...], reason: str, *, stop: tuple[str, ...],
        fault: bool = True,
    ) -> Decision:  # fmt: skip
        run = self.run
        delay = backoff_s(run.fault_restarts, self.config) if fault else 0.0
        new = msgspec.structs.replace(
            run, generation=run.generation + 1, nodes=nodes, started_at=self.now + delay,
            restart_count=run.restart_count + 1, fault_restarts=run.fault_restarts + int(fault),
            done_nodes=(), phase=Phase.RUNNING, spare_keep=(), spare_asked_at=None,
            pending_failure=None,
            history=self.history(verdict, reason),
        )  # fmt: skip
        start = StartGeneration(
            generation=new.generation, nodes=nodes, restart_count=new.restart_count, delay_s=delay
        )
        stopping = _stop(stop, self.config.restart_grace_s)
        return Decision(verdict=verdict, run=new, actions=(*stopping, start))

    def requeue(self, reason: str, *, stop: tuple[str, ...]) -> Decision:
        """Back to the queue after a fault (counted, backed off), or NODE_FAIL."""
        run = self.run
        if not run.spec.requeue:
            return self.finish(Verdict.FAIL, JobState.NODE_FAIL, reason, stop=stop)
        new = msgspec.structs.replace(
            run, phase=Phase.ENDED, restart_count=run.restart_count + 1,
            fault_restarts=run.fault_restarts + 1, history=self.history(Verdict.REQUEUE, reason),
        )  # fmt: skip
        requeue = Requeue(
            restart_count=new.restart_count, excluded_nodes=run.excluded_nodes,
            delay_s=backoff_s(run.fault_restarts, self.config), reason=reason,
        )  # fmt: skip
        stopping = _stop(stop, self.config.restart_grace_s)
        return Decision(verdict=Verdict.REQUEUE, run=new, actions=(*stopping, requeue))

    def preempt(self, obs: Preempt) -> Decision:
        """Stop within the grace; requeue (not counted, no backoff) or end PREEMPTED."""
        run = self.run
        if not run.spec.requeue:
            new = msgspec.structs.replace(
                self.run, phase=Phase.ENDED, final_state=JobState.PREEMPTED,
                history=self.history(Verdict.PREEMPT, "preempted"),
            )  # fmt: skip
            finish = Finish(state=JobState.PREEMPTED, reason="preempted")
            actions = (*_stop(self.live, obs.grace_s), finish)
            return Decision(verdict=Verdict.PREEMPT, run=new, actions=actions)
        new = msgspec.structs.replace(
            run, phase=Phase.ENDED, restart_count=run.restart_count + 1,
            history=self.history(Verdict.REQUEUE, "preempted"),
        )  # fmt: skip
        requeue = Requeue(
            restart_count=new.restart_count, excluded_nodes=run.excluded_nodes, delay_s=0.0,
            reason="preempted",
        )  # fmt: skip
        actions = (*_stop(self.live, obs.grace_s), requeue)
        return Decision(verdict=Verdict.REQUEUE, run=new, actions=actions)

    def requeue_asked(self, obs: RequeueAsked) -> Decision:
        """Stop the workers and requeue at once: same id, restart_count + 1, as Slurm's
        scontrol requeue (whatever --requeue says: that is for faults), not counted
        toward the fault restart limit, no backoff. Only a running job: one between
        generations (awaiting spares) is already stopped and on its way."""
        run = self.run
        if not self.running:
            return self.ignore()
        new = msgspec.structs.replace(
            run, phase=Phase.ENDED, restart_count=run.restart_count + 1,
            history=self.history(Verdict.REQUEUE, obs.reason),
        )  # fmt: skip
        requeue = Requeue(
            restart_count=new.restart_count, excluded_nodes=run.excluded_nodes, delay_s=0.0,
            reason=obs.reason,
        )  # fmt: skip
        actions = (*_stop(self.live, self.config.kill_wait_s), requeue)
        return Decision(verdict=Verdict.REQUEUE, run=new, actions=actions)

    def start_failed(self, obs: StartFailed) -> Decision:
        """No partial start: stop the nodes that did start, requeue without the nodes
        that refused (counted and backed off like a fault), or NODE_FAIL at the
        restart limit. A node whose agent did not answer (restarting, paused) is not
        excluded, or a job as wide as the cluster could never run again: its agent and
        its health probe are one process, so a node that stays silent goes SUSPECT and
        out of placement. It is asked to stop too, so a start still on its way runs
        nothing."""
        run = self.run
        if obs.generation != run.generation or not self.running:
            return self.ignore()
        refused = set(obs.nodes) - set(obs.unanswered)
        started = tuple(n for n in self.live if n not in refused)
        excluded = run.excluded_nodes
        for node in obs.nodes:
            if node in refused:
                excluded = _excluding(excluded, node)
        self.run = run = msgspec.structs.replace(run, excluded_nodes=excluded)
        reason = f"could not start on {','.join(obs.nodes)}: {obs.reason}"
        if run.fault_restarts >= self.config.max_restarts:
            reason = f"{reason}; restart limit of {self.config.max_restarts} reached"
            return self.finish(Verdict.FAIL, JobState.NODE_FAIL, reason, stop=started)
        return self.requeue(reason, stop=started)

    def signal_due(self) -> Decision:
        """`--signal=[B:]SIG@secs`: once, to the workers still running (an sbatch job's
        steps; with `B:` its script alone: `signal_targets`)."""
        run = self.run
        sig = parse_signal(run.spec.signal or "")
        if sig is None or run.signal_sent or not self.live:
            return self.ignore()
        only = run.spec.signal_batch_only
        scope = SignalScope.WORKER if only else None
        acts = signal_targets(run.spec, self.live, sig, scope, leader_only=only)
        new = msgspec.structs.replace(run, signal_sent=True)
        return Decision(verdict=Verdict.SIGNAL, run=new, actions=acts)
