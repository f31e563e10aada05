"""Table tests of the job coordinator's decisions (services/launcher/coordinator_core.py).

Each case: a narrative name -> the job's state, one observation, and the whole
expected decision (verdict, actions in order, and every change to the state).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.launcher.coordinator_core import (
    AllocationGone,
    AnyAction,
    AnyObservation,
    AttemptRecord,
    Cancel,
    CoordinatorConfig,
    Decision,
    Finish,
    JobRun,
    JobState,
    NodeDown,
    NodeFault,
    NodesAvailable,
    PendingFailure,
    Phase,
    Preempt,
    Rearm,
    RequestSpares,
    Requeue,
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
    Verdict,
    WorkerExited,
    backoff_s,
    decide,
    due_at,
    due_or_rearm,
    parse_signal,
    signal_targets,
    start_run,
    timers,
)
from services.launcher.exitstatus import ExitStatus
from shared.jobspec import JobSpec
from shared.signal_scope import SignalScope

T0, NOW = 1000.0, 1600.0
CFG = CoordinatorConfig()
NO_SPARES = CoordinatorConfig(replace_with_spare=False)
AT_ONCE = CoordinatorConfig(failure_settle_s=0)  # a failed worker fails the job at once
ABC = ("a", "b", "c")
KILL, GRACE = CFG.kill_wait_s, CFG.restart_grace_s


def job(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {"user": "alice", "script": "train.py", "nodes_min": 3, "nodes_max": 3}
    return JobSpec(**(base | kw))


ELASTIC = job(nodes_min=2, nodes_max=4, elastic=True)


def running(spec: JobSpec | None = None, nodes: tuple[str, ...] = ABC, **kw: Any) -> JobRun:
    run = start_run(spec or job(), job_id=7, nodes=nodes, now=T0)
    return msgspec.structs.replace(run, **kw)


def record(run: JobRun, verdict: Verdict, reason: str) -> AttemptRecord:
    return AttemptRecord(
        generation=run.generation, nodes=run.nodes, world_size=len(run.nodes), started_at=T0,
        ended_at=NOW, verdict=verdict, reason=reason,
    )  # fmt: skip


def then(
    run: JobRun, verdict: Verdict, *actions: AnyAction, closed: str | None = None, **changes: Any
) -> Decision:
    """The expected decision: `run` with `changes`, its generation closed with `closed`."""
    if closed is not None:
        changes["history"] = (*run.history, record(run, verdict, closed))
    return Decision(verdict=verdict, run=msgspec.structs.replace(run, **changes), actions=actions)


def ended(run: JobRun, verdict: Verdict, state: JobState, reason: str, *stop: AnyAction,
          **kw: Any) -> Decision:  # fmt: skip
    """Expected end: `exit_code` / `signal` go to the Finish, other keywords to the run."""
    status = {k: kw.pop(k) for k in ("exit_code", "signal") if k in kw}
    final = Finish(state=state, reason=reason, **status)
    return then(run, verdict, *stop, final, closed=reason, phase=Phase.ENDED, final_state=state,
                **kw)  # fmt: skip


def exited(
    node: str,
    code: int | None = 0,
    sig: int | None = None,
    *,
    lost: bool = False,
    fenced: bool = False,
    **kw: Any,
) -> WorkerExited:
    status = ExitStatus(exit_code=code if sig is None else None, signal=sig, **kw)
    return WorkerExited(node=node, generation=0, status=status, lost=lost, fenced=fenced)


R = running()
R_TWO_DONE = running(done_nodes=("a", "b"))
R_ELASTIC = running(ELASTIC)
R_ELASTIC_AT_MIN = running(ELASTIC, nodes=("a", "b"))
R_SIGNAL = running(job(signal="USR1", signal_before_s=120))
# `--batch-nodes=first` (sbatch's): the script on a alone, b and c hold the allocation
R_BATCH = running(job(batch_first_node=True))
R_BATCH_SIGNAL = running(job(batch_first_node=True, signal="USR1", signal_before_s=120))
R_BATCH_B = running(
    job(batch_first_node=True, signal="USR1", signal_before_s=120, signal_batch_only=True)
)
# What a fixed-size job's fault leaves: workers stopped, the placer asked for a spare.
R_SPARE = decide(R, NodeFault(node="b", reason="xid 79"), CFG, T0 + 10).run
LOST_B = "node b lost: xid 79"
EXIT_1 = "worker on b ended with exit 1"
LOST_WORKER_B = "node b lost: its worker was lost (signal SIGKILL, no exit recorded)"
FENCED_B = "node b lost: its worker was fenced (the node lost the control plane)"
STEP_TASK = "a task of step 7.0 was fenced or lost there"
STEP_LOST_B = f"node b lost: {STEP_TASK}"
NO_START_B = "could not start on b: no responders"
GONE = "allocation released by the placer"
ASK_B = StopWorkers(nodes=("b",), grace_s=GRACE, best_effort=True)
# A worker failed a moment ago; is a node fault on its way?
R_SETTLING = decide(R, exited("b", 1), CFG, T0 + 5).run
R_SETTLING_ELASTIC = decide(R_ELASTIC, exited("b", 1), CFG, T0 + 5).run

WORKER_CASES: dict[str, tuple[JobRun, AnyObservation, CoordinatorConfig, Decision]] = {
    "the last worker exiting 0 completes the job": (
        R_TWO_DONE, exited("c"), CFG,
        ended(R_TWO_DONE, Verdict.COMPLETE, JobState.COMPLETED, "all 3 workers exited 0",
              exit_code=0, done_nodes=ABC),
    ),
    "the batch script exiting 0 on the first node completes the job, its holders stopped": (
        R_BATCH, exited("a"), CFG,
        ended(R_BATCH, Verdict.COMPLETE, JobState.COMPLETED, "the batch script on a exited 0",
              StopWorkers(nodes=("b", "c"), grace_s=KILL), exit_code=0),
    ),
    "the batch script failing on the first node fails the job as any worker's would": (
        R_BATCH, exited("a", 3), AT_ONCE,
        ended(R_BATCH, Verdict.FAIL, JobState.FAILED, "worker on a ended with exit 3",
              StopWorkers(nodes=("b", "c"), grace_s=KILL), exit_code=3),
    ),
    "a holder exiting 0 leaves the batch script running": (
        R_BATCH, exited("b"), CFG, then(R_BATCH, Verdict.CONTINUE, done_nodes=("b",)),
    ),
    "one worker exiting 0 waits for the others": (
        R, exited("a"), CFG, then(R, Verdict.CONTINUE, done_nodes=("a",)),
    ),
    "a non-zero exit fails the job and stops the others": (
        R, exited("a", 2), AT_ONCE,
        ended(R, Verdict.FAIL, JobState.FAILED, "worker on a ended with exit 2",
              StopWorkers(nodes=("b", "c"), grace_s=KILL), exit_code=2),
    ),
    "death by a signal fails the job with that signal": (
        R_TWO_DONE, exited("c", sig=11), AT_ONCE,
        ended(R_TWO_DONE, Verdict.FAIL, JobState.FAILED, "worker on c ended with signal SIGSEGV",
              signal=11),
    ),
    "an OOM kill ends the job OUT_OF_MEMORY": (
        R, exited("b", sig=9, oom_killed=True), AT_ONCE,
        ended(R, Verdict.FAIL, JobState.OUT_OF_MEMORY, "worker on b ended with out of memory",
              StopWorkers(nodes=("a", "c"), grace_s=KILL), signal=9),
    ),
    "a worker that could not start fails the job": (
        R, WorkerExited(node="c", generation=0, status=ExitStatus(), spawn_failed="no user bob"),
        CFG,
        ended(R, Verdict.FAIL, JobState.FAILED, "worker on c did not start: no user bob",
              StopWorkers(nodes=("a", "b"), grace_s=KILL)),
    ),
    "a worker lost with its node (crashed, rebooted) restarts the job as a node fault": (
        R, exited("b", sig=9, lost=True), NO_SPARES,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=ABC, grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason=LOST_WORKER_B),
             closed=LOST_WORKER_B, phase=Phase.ENDED, restart_count=1, fault_restarts=1),
    ),  # not excluded: its agent is back (it said so) and passed its health check
    "an elastic job that lost a worker with its node shrinks at once": (
        R_ELASTIC, exited("b", sig=9, lost=True), CFG,
        then(R_ELASTIC, Verdict.SHRINK, StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=LOST_WORKER_B, generation=1, nodes=("a", "c"), started_at=NOW,
             restart_count=1, fault_restarts=1),
    ),
    "a worker its node fenced (cut off from the control plane) restarts the job": (
        R_ELASTIC, exited("b", sig=15, fenced=True), CFG,
        then(R_ELASTIC, Verdict.SHRINK, StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=FENCED_B, generation=1, nodes=("a", "c"), started_at=NOW,
             restart_count=1, fault_restarts=1),
    ),
    "a failed worker first waits a moment for a node fault that would explain it": (
        R, exited("b", 1), CFG,
        then(R, Verdict.SETTLE, phase=Phase.SETTLING, pending_failure=PendingFailure(
            node="b", state=JobState.FAILED, reason=EXIT_1, exit_code=1, settle_at=NOW + 2.0)),
    ),
    "with no node lost in that moment the job fails and the others are stopped": (
        R_SETTLING, SettleElapsed(), CFG,
        ended(R_SETTLING, Verdict.FAIL, JobState.FAILED, EXIT_1,
              StopWorkers(nodes=("a", "c"), grace_s=KILL), exit_code=1),
    ),
    "a node fault in that moment shrinks the job instead of failing it": (
        R_SETTLING_ELASTIC, NodeFault(node="b", reason="xid 79"), CFG,
        then(R_SETTLING_ELASTIC, Verdict.SHRINK, StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=LOST_B, generation=1, nodes=("a", "c"), started_at=NOW, restart_count=1,
             fault_restarts=1, excluded_nodes=("b",), phase=Phase.RUNNING,
             pending_failure=None),
    ),
    "a step's task lost with its node requeues the job as a node fault, not excluded": (
        R, StepNodeLost(node="b", generation=0, reason=STEP_TASK), NO_SPARES,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=ABC, grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason=STEP_LOST_B),
             closed=STEP_LOST_B, phase=Phase.ENDED, restart_count=1, fault_restarts=1),
    ),  # the batch script's failure it causes (srun's status) then finds the run ended
    "a step's task lost while a failure settles restarts the job instead of failing it": (
        R_SETTLING_ELASTIC, StepNodeLost(node="b", generation=0, reason=STEP_TASK), CFG,
        then(R_SETTLING_ELASTIC, Verdict.SHRINK, StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=STEP_LOST_B, generation=1, nodes=("a", "c"), started_at=NOW,
             restart_count=1, fault_restarts=1, phase=Phase.RUNNING, pending_failure=None),
    ),
    "a step's task lost in an earlier generation is ignored": (
        running(generation=2), StepNodeLost(node="b", generation=1, reason=STEP_TASK), CFG,
        then(running(generation=2), Verdict.IGNORE),
    ),
    "a second failure in that moment keeps the first as the reason": (
        R_SETTLING, exited("a", sig=6), CFG, then(R_SETTLING, Verdict.IGNORE),
    ),
    "an exit reported for an earlier generation is ignored": (
        running(generation=2), exited("a", 1), CFG, then(running(generation=2), Verdict.IGNORE),
    ),
}  # fmt: skip

FAULT_CASES: dict[str, tuple[JobRun, AnyObservation, CoordinatorConfig, Decision]] = {
    "a hardware fault shrinks an elastic job onto the survivors at once": (
        R_ELASTIC, NodeFault(node="b", reason="xid 79"), CFG,
        then(R_ELASTIC, Verdict.SHRINK, StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=LOST_B, generation=1, nodes=("a", "c"), started_at=NOW, restart_count=1,
             fault_restarts=1, excluded_nodes=("b",)),
    ),
    "a node that went down is still asked to stop its worker, but nothing waits on it": (
        R_ELASTIC, NodeDown(node="b", reason="xid 79"), CFG,
        then(R_ELASTIC, Verdict.SHRINK, ASK_B, StopWorkers(nodes=("a", "c"), grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed=LOST_B, generation=1, nodes=("a", "c"), started_at=NOW, restart_count=1,
             fault_restarts=1, excluded_nodes=("b",)),
    ),
    "the third fault restart waits out the exponential backoff": (
        running(ELASTIC, fault_restarts=2, restart_count=2), NodeFault(node="b", reason="xid 79"),
        CFG,
        then(running(ELASTIC, fault_restarts=2, restart_count=2), Verdict.SHRINK,
             StopWorkers(nodes=ABC, grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=3, delay_s=2.0),
             closed=LOST_B, generation=1, nodes=("a", "c"), started_at=NOW + 2.0, restart_count=3,
             fault_restarts=3, excluded_nodes=("b",)),
    ),
    "an elastic job that would fall below its minimum asks for a spare": (
        R_ELASTIC_AT_MIN, NodeFault(node="b", reason="xid 79"), CFG,
        then(R_ELASTIC_AT_MIN, Verdict.REPLACE, StopWorkers(nodes=("a", "b"), grace_s=GRACE),
             RequestSpares(count=1, keep=("a",), exclude=("b",)), closed=LOST_B,
             phase=Phase.AWAITING_SPARE, spare_keep=("a",), excluded_nodes=("b",),
             spare_asked_at=NOW),
    ),
    "a fixed-size job asks the placer for a spare": (
        R, NodeFault(node="b", reason="xid 79"), CFG,
        then(R, Verdict.REPLACE, StopWorkers(nodes=ABC, grace_s=GRACE),
             RequestSpares(count=1, keep=("a", "c"), exclude=("b",)), closed=LOST_B,
             phase=Phase.AWAITING_SPARE, spare_keep=("a", "c"), excluded_nodes=("b",),
             spare_asked_at=NOW),
    ),
    "without spares a fixed-size job is requeued with the bad node excluded": (
        R, NodeFault(node="b", reason="xid 79"), NO_SPARES,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=ABC, grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=("b",), delay_s=0.0, reason=LOST_B),
             closed=LOST_B, phase=Phase.ENDED, restart_count=1, fault_restarts=1,
             excluded_nodes=("b",)),
    ),
    "a job that may not be requeued ends NODE_FAIL": (
        running(job(requeue=False)), NodeDown(node="b", reason="xid 79"), NO_SPARES,
        ended(running(job(requeue=False)), Verdict.FAIL, JobState.NODE_FAIL, LOST_B, ASK_B,
              StopWorkers(nodes=("a", "c"), grace_s=KILL), excluded_nodes=("b",)),
    ),
    "a node that goes down after its worker exited 0 is not asked again": (
        running(ELASTIC, done_nodes=("b",)), NodeDown(node="b", reason="silent"), CFG,
        then(running(ELASTIC, done_nodes=("b",)), Verdict.SHRINK,
             StopWorkers(nodes=("a", "c"), grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c"), restart_count=1, delay_s=0.0),
             closed="node b lost: silent", generation=1, nodes=("a", "c"), started_at=NOW,
             restart_count=1, fault_restarts=1, excluded_nodes=("b",), done_nodes=()),
    ),
    "a node down that the job does not use asks nobody anything": (
        R, NodeDown(node="z", reason="silent"), CFG, then(R, Verdict.IGNORE),
    ),
    "the restart limit turns one more fault into NODE_FAIL": (
        running(ELASTIC, fault_restarts=3), NodeFault(node="b", reason="xid 79"), CFG,
        ended(running(ELASTIC, fault_restarts=3), Verdict.FAIL, JobState.NODE_FAIL,
              f"{LOST_B}; restart limit of 3 reached", StopWorkers(nodes=ABC, grace_s=KILL),
              excluded_nodes=("b",)),
    ),
    "an application fault fails the job, not the node": (
        R, NodeFault(node="a", reason="xid 13", excludes_node=False), CFG,
        ended(R, Verdict.FAIL, JobState.FAILED, "application fault on a: xid 13",
              StopWorkers(nodes=ABC, grace_s=KILL)),
    ),
    "a fault on a node the job does not use is ignored": (
        R, NodeFault(node="z"), CFG, then(R, Verdict.IGNORE),
    ),
    "granted spares restart the job on the survivors plus the spares": (
        R_SPARE, SparesGranted(nodes=("d",)), CFG,
        then(R_SPARE, Verdict.RESTART,
             StartGeneration(generation=1, nodes=("a", "c", "d"), restart_count=1, delay_s=0.0),
             generation=1, nodes=("a", "c", "d"), started_at=NOW, restart_count=1,
             fault_restarts=1, phase=Phase.RUNNING, spare_keep=(), spare_asked_at=None),
    ),
    "no spare requeues the job, the bad node still excluded": (
        R_SPARE, SparesDenied(), CFG,
        then(R_SPARE, Verdict.REQUEUE,
             Requeue(restart_count=1, excluded_nodes=("b",), delay_s=0.0,
                     reason="no spare node available"),
             phase=Phase.ENDED, restart_count=1, fault_restarts=1),
    ),
    "losing another node while waiting for a spare asks for one more": (
        R_SPARE, NodeDown(node="a"), CFG,
        then(R_SPARE, Verdict.REPLACE, RequestSpares(count=2, keep=("c",), exclude=("b", "a")),
             spare_keep=("c",), excluded_nodes=("b", "a"), spare_asked_at=NOW),
    ),
    "an elastic job grows back onto what the placer offers, a recovered node included": (
        running(ELASTIC, nodes=("a", "c"), excluded_nodes=("b",)),
        NodesAvailable(nodes=("b", "d", "e", "f")), CFG,
        then(running(ELASTIC, nodes=("a", "c"), excluded_nodes=("b",)), Verdict.GROW,
             StopWorkers(nodes=("a", "c"), grace_s=GRACE),
             StartGeneration(generation=1, nodes=("a", "c", "b", "d"), restart_count=1,
                             delay_s=0.0),
             closed="growing to 4 nodes", generation=1, nodes=("a", "c", "b", "d"),
             started_at=NOW, restart_count=1),
    ),
    "a gang that did not start on one node stops the others and requeues without it": (
        R, StartFailed(generation=0, nodes=("b",), reason="no responders"), CFG,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=("a", "c"), grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=("b",), delay_s=0.0, reason=NO_START_B),
             closed=NO_START_B, phase=Phase.ENDED, restart_count=1, fault_restarts=1,
             excluded_nodes=("b",)),
    ),
    "a node whose agent did not answer is asked to stop too, and not excluded": (
        R, StartFailed(generation=0, nodes=("b",), reason="no responders", unanswered=("b",)),
        CFG,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=("a", "b", "c"), grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason=NO_START_B),
             closed=NO_START_B, phase=Phase.ENDED, restart_count=1, fault_restarts=1),
    ),
    "of two failed nodes only the one that refused is excluded": (
        R, StartFailed(generation=0, nodes=("a", "b"), reason="no responders",
                       unanswered=("b",)),
        CFG,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=("b", "c"), grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=("a",), delay_s=0.0,
                     reason="could not start on a,b: no responders"),
             closed="could not start on a,b: no responders", phase=Phase.ENDED,
             restart_count=1, fault_restarts=1, excluded_nodes=("a",)),
    ),
    "a gang start failure at the restart limit ends NODE_FAIL": (
        running(fault_restarts=3), StartFailed(generation=0, nodes=("b",), reason="no responders"),
        CFG,
        ended(running(fault_restarts=3), Verdict.FAIL, JobState.NODE_FAIL,
              f"{NO_START_B}; restart limit of 3 reached",
              StopWorkers(nodes=("a", "c"), grace_s=KILL), excluded_nodes=("b",)),
    ),
    "a start failure of an earlier generation is ignored": (
        running(generation=2), StartFailed(generation=1, nodes=("b",), reason="x"), CFG,
        then(running(generation=2), Verdict.IGNORE),
    ),
    "a fixed-size job does not grow": (
        R, NodesAvailable(nodes=("d",)), CFG, then(R, Verdict.IGNORE),
    ),
}  # fmt: skip

CONTROL_CASES: dict[str, tuple[JobRun, AnyObservation, CoordinatorConfig, Decision]] = {
    "the time limit times the job out: SIGTERM, then SIGKILL after kill_wait": (
        R, TimeLimitReached(), CFG,
        ended(R, Verdict.TIMEOUT, JobState.TIMEOUT, "time limit of 3600 s reached",
              StopWorkers(nodes=ABC, grace_s=30.0)),
    ),
    "--signal sends its signal to every worker before the limit": (
        R_SIGNAL, SignalDue(), CFG,
        then(R_SIGNAL, Verdict.SIGNAL, SignalWorkers(nodes=ABC, signal=10), signal_sent=True),
    ),
    "an sbatch job's --signal goes to its steps' tasks on every node, as Slurm's": (
        R_BATCH_SIGNAL, SignalDue(), CFG,
        then(R_BATCH_SIGNAL, Verdict.SIGNAL,
             SignalWorkers(nodes=ABC, signal=10, scope=SignalScope.STEPS), signal_sent=True),
    ),
    "an sbatch job's --signal=B: goes to its script alone, on the first node": (
        R_BATCH_B, SignalDue(), CFG,
        then(R_BATCH_B, Verdict.SIGNAL, SignalWorkers(nodes=("a",), signal=10, leader_only=True),
             signal_sent=True),
    ),
    "--signal is sent once": (
        running(job(signal="USR1"), signal_sent=True), SignalDue(), CFG,
        then(running(job(signal="USR1"), signal_sent=True), Verdict.IGNORE),
    ),
    "a batch-only --signal goes to the script, not its children": (
        running(job(signal="SIGUSR2", signal_batch_only=True)), SignalDue(), CFG,
        then(running(job(signal="SIGUSR2", signal_batch_only=True)), Verdict.SIGNAL,
             SignalWorkers(nodes=ABC, signal=12, leader_only=True), signal_sent=True),
    ),
    "preemption stops within its grace and requeues the same job, restart_count + 1": (
        R, Preempt(grace_s=60), CFG,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=ABC, grace_s=60),
             Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason="preempted"),
             closed="preempted", phase=Phase.ENDED, restart_count=1),
    ),
    "preempting a job that may not be requeued ends it PREEMPTED": (
        running(job(requeue=False)), Preempt(grace_s=10), CFG,
        ended(running(job(requeue=False)), Verdict.PREEMPT, JobState.PREEMPTED, "preempted",
              StopWorkers(nodes=ABC, grace_s=10)),
    ),
    "cancel stops every worker still running and ends CANCELLED": (
        running(done_nodes=("b",)), Cancel(reason="scancel by alice"), CFG,
        ended(running(done_nodes=("b",)), Verdict.CANCEL, JobState.CANCELLED,
              "scancel by alice", StopWorkers(nodes=("a", "c"), grace_s=KILL)),
    ),
    "a release with status 0 (salloc's command exited 0) ends COMPLETED, workers stopped": (
        R, Cancel(reason="salloc's command exited 0", exit_code=0), CFG,
        ended(R, Verdict.COMPLETE, JobState.COMPLETED, "salloc's command exited 0",
              StopWorkers(nodes=ABC, grace_s=KILL), exit_code=0),
    ),
    "a release with a failing status ends FAILED with that status": (
        running(done_nodes=("b",)), Cancel(reason="srun's command exited 3", exit_code=3), CFG,
        ended(running(done_nodes=("b",)), Verdict.FAIL, JobState.FAILED,
              "srun's command exited 3", StopWorkers(nodes=("a", "c"), grace_s=KILL),
              exit_code=3),
    ),
    "cancel while waiting for a spare has nothing left to stop": (
        R_SPARE, Cancel(), CFG,
        then(R_SPARE, Verdict.CANCEL, Finish(state=JobState.CANCELLED, reason="cancelled by user"),
             phase=Phase.ENDED, final_state=JobState.CANCELLED),
    ),
    "a run whose allocation was released is stopped at once and requeued, uncounted": (
        R, AllocationGone(), CFG,
        then(R, Verdict.REQUEUE, StopWorkers(nodes=ABC, grace_s=GRACE),
             Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason=GONE),
             closed=GONE, phase=Phase.ENDED, restart_count=1),
    ),
    "a run that may not be requeued fails when its allocation is released": (
        running(job(requeue=False)), AllocationGone(), CFG,
        ended(running(job(requeue=False)), Verdict.FAIL, JobState.FAILED, GONE,
              StopWorkers(nodes=ABC, grace_s=KILL)),
    ),
    "a released allocation while awaiting spares has nothing to stop": (
        R_SPARE, AllocationGone(), CFG, then(R_SPARE, Verdict.IGNORE),
    ),
    "nothing is decided after the end": (
        running(phase=Phase.ENDED), TimeLimitReached(), CFG,
        then(running(phase=Phase.ENDED), Verdict.IGNORE),
    ),
}  # fmt: skip

CASES = WORKER_CASES | FAULT_CASES | CONTROL_CASES


@pytest.mark.parametrize(("run", "obs", "config", "want"), CASES.values(), ids=CASES.keys())
def test_decide(
    run: JobRun, obs: AnyObservation, config: CoordinatorConfig, want: Decision
) -> None:
    assert decide(run, obs, config, NOW) == want


def test_a_node_fault_then_a_clean_finish_leaves_a_two_generation_history() -> None:
    d1 = decide(running(ELASTIC), NodeFault(node="b", reason="xid 79"), CFG, NOW)
    stale = decide(d1.run, exited("a", sig=15), CFG, NOW + 1)  # generation 0's worker, stopped
    d2 = decide(stale.run, WorkerExited(node="a", generation=1, status=ExitStatus(exit_code=0)),
                CFG, NOW + 50)  # fmt: skip
    d3 = decide(d2.run, WorkerExited(node="c", generation=1, status=ExitStatus(exit_code=0)),
                CFG, NOW + 60)  # fmt: skip
    assert [d.verdict for d in (d1, stale, d2, d3)] == [
        Verdict.SHRINK, Verdict.IGNORE, Verdict.CONTINUE, Verdict.COMPLETE,
    ]  # fmt: skip
    assert [(h.generation, h.nodes, h.verdict, h.ended_at) for h in d3.run.history] == [
        (0, ABC, Verdict.SHRINK, NOW), (1, ("a", "c"), Verdict.COMPLETE, NOW + 60),
    ]  # fmt: skip
    assert d3.run.final_state is JobState.COMPLETED


def test_decisions_are_plain_data_that_round_trip_through_json() -> None:
    d = decide(running(ELASTIC), NodeFault(node="b"), CFG, NOW)
    assert msgspec.json.decode(msgspec.json.encode(d), type=Decision) == d


TIMER_CASES = {
    "without --signal only the limit is timed": (running(), None, T0 + 3600),
    "--signal=USR1@120 fires 120 s before the limit": (R_SIGNAL, T0 + 3480, T0 + 3600),
    "a sent signal is not timed again": (
        running(job(signal="USR1"), signal_sent=True), None, T0 + 3600,
    ),
    "a settling failure is timed": (
        R_SETTLING, None, T0 + 3600,
    ),
    "a shrink restart keeps the original limit": (
        running(limit_from=T0 - 100, started_at=T0), None, T0 + 3500,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("run", "signal_at", "limit_at"), TIMER_CASES.values(), ids=TIMER_CASES.keys()
)
def test_timers(run: JobRun, signal_at: float | None, limit_at: float) -> None:
    got = timers(run)
    settle_at = T0 + 5 + CFG.failure_settle_s if run.phase is Phase.SETTLING else None
    assert (got.signal_at, got.limit_at, got.settle_at) == (signal_at, limit_at, settle_at)


def test_backoff_is_immediate_first_then_doubles_up_to_the_cap() -> None:
    cfg = CoordinatorConfig(backoff_base_s=1.0, backoff_max_s=5.0)
    assert [backoff_s(n, cfg) for n in range(6)] == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_parse_signal_takes_names_with_or_without_sig_and_numbers() -> None:
    assert [parse_signal(s) for s in ("USR1", "sigterm", "10", "NOPE", "")] == [
        10, 15, 10, None, None,
    ]  # fmt: skip


def test_a_request_for_spares_unanswered_for_spare_wait_s_is_due_as_denied() -> None:
    from services.launcher.coordinator_core import SPARE_WAIT_S, SparesDenied, timers

    assert timers(R_SPARE).spare_deadline == T0 + 10 + SPARE_WAIT_S
    denied = decide(R_SPARE, SparesDenied(), CFG, T0 + 10 + SPARE_WAIT_S)
    assert denied.verdict is Verdict.REQUEUE


def test_a_stored_run_keeps_its_field_names_so_rows_written_before_the_rename_still_load() -> None:
    stored = msgspec.json.encode(R_SETTLING)
    assert b'"attempt":0' in stored and b"generation" not in stored
    assert msgspec.json.decode(stored, type=JobRun) == R_SETTLING


# A limit changed while the job runs (`muster update --time`): the timer that fires, or
# the `job.limit_changed` that arrives, reads the run with the job's new spec.
REARM_CASES = {
    "raised past now: nothing due, the due time written again": (
        job(time_limit_s=7200), T0 + 3600, Rearm(), T0 + 7200,
    ),
    "lowered, not yet reached: the sooner due time written": (
        job(time_limit_s=600), T0 + 300, Rearm(), T0 + 600,
    ),
    "lowered below what it has run: the limit is reached now": (
        job(time_limit_s=60), T0 + 300, TimeLimitReached(), None,
    ),
    "a --signal before the new limit is timed from it": (
        job(time_limit_s=7200, signal="USR1", signal_before_s=60), T0 + 3600, Rearm(),
        T0 + 7140,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "now", "obs", "due"), REARM_CASES.values(), ids=REARM_CASES.keys()
)
def test_a_changed_limit_re_arms_the_timers_or_ends_the_job(
    spec: JobSpec, now: float, obs: AnyObservation, due: float | None
) -> None:
    run = msgspec.structs.replace(running(), spec=spec)  # the spec as the shell loads it
    assert due_or_rearm(run, now) == obs
    decision = decide(run, obs, CFG, now)
    if due is None:
        assert decision.verdict is Verdict.TIMEOUT
        return
    assert decision == then(run, Verdict.CONTINUE)  # nothing but the due time changes
    assert due_at(decision.run) == due


def test_a_timer_that_is_due_is_delivered_as_itself() -> None:
    assert due_or_rearm(R, T0 + 3600) == TimeLimitReached()
    assert due_or_rearm(R_SIGNAL, timers(R_SIGNAL).signal_at or 0) == SignalDue()


EVERY_NODE = job()
SBATCH = job(batch_first_node=True)
TARGETS = {
    "a job whose worker is its work: the workers": (
        EVERY_NODE, None, (SignalWorkers(nodes=ABC, signal=10),),
    ),
    "an sbatch job: its steps' tasks on every node": (
        SBATCH, None, (SignalWorkers(nodes=ABC, signal=10, scope=SignalScope.STEPS),),
    ),
    "an sbatch job, -b: its script on the first node": (
        SBATCH, SignalScope.WORKER, (SignalWorkers(nodes=("a",), signal=10),),
    ),
    "an sbatch job, -f: both": (
        SBATCH, SignalScope.FULL,
        (SignalWorkers(nodes=("a",), signal=10),
         SignalWorkers(nodes=ABC, signal=10, scope=SignalScope.STEPS)),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("spec", "scope", "want"), TARGETS.values(), ids=TARGETS.keys())
def test_where_a_signal_goes(
    spec: JobSpec, scope: SignalScope | None, want: tuple[SignalWorkers, ...]
) -> None:
    """scancel -s / -b / -f, as Slurm sends them; b and c of an sbatch job hold the
    allocation for its steps and their workers are never signalled."""
    assert signal_targets(spec, ABC, 10, scope) == want
