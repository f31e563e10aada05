"""Pure: the coordinator core on `scontrol requeue` (RequeueAsked).

A running job's workers are stopped (the kill wait, as a cancel) and it goes back to
the queue at once: same id, restart_count + 1, not counted as a fault, whether or not
it may be requeued after faults (`--no-requeue` is about faults, as in Slurm). A run
that is not running (awaiting spares, ended) is left alone.
"""

from __future__ import annotations

import msgspec

from services.launcher.coordinator_core import (
    AttemptRecord,
    CoordinatorConfig,
    Decision,
    JobRun,
    Phase,
    Requeue,
    RequeueAsked,
    StopWorkers,
    Verdict,
    decide,
    start_run,
)
from shared.jobspec import JobSpec

T0, NOW = 1000.0, 1600.0
CFG = CoordinatorConfig()
ASKED = RequeueAsked(reason="requeued by alice")


def running(**spec: object) -> JobRun:
    base: dict[str, object] = {"user": "alice", "script": "x", "nodes_min": 2, "nodes_max": 2}
    return start_run(JobSpec(**(base | spec)), job_id=7, nodes=("a", "b"), now=T0)  # type: ignore[arg-type]


def requeued(run: JobRun) -> Decision:
    closed = AttemptRecord(
        generation=0, nodes=("a", "b"), world_size=2, started_at=T0, ended_at=NOW,
        verdict=Verdict.REQUEUE, reason="requeued by alice",
    )  # fmt: skip
    new = msgspec.structs.replace(run, phase=Phase.ENDED, restart_count=1, history=(closed,))
    return Decision(
        verdict=Verdict.REQUEUE,
        run=new,
        actions=(
            StopWorkers(nodes=("a", "b"), grace_s=CFG.kill_wait_s),
            Requeue(restart_count=1, excluded_nodes=(), delay_s=0.0, reason="requeued by alice"),
        ),
    )


def test_a_running_job_is_stopped_and_requeued_with_restart_count_plus_one() -> None:
    run = running()
    assert decide(run, ASKED, CFG, NOW) == requeued(run)


def test_a_job_that_faults_may_not_requeue_is_still_requeued_when_asked() -> None:
    run = running(requeue=False)
    assert decide(run, ASKED, CFG, NOW) == requeued(run)


def test_a_run_not_running_is_left_alone() -> None:
    for phase in (Phase.AWAITING_SPARE, Phase.ENDED):
        run = msgspec.structs.replace(running(), phase=phase)
        assert decide(run, ASKED, CFG, NOW) == Decision(verdict=Verdict.IGNORE, run=run)
