"""Shell: how a run ends, inside the caller's transaction: the final `job_runs` row and
the events owed (`job.finished`, or `job.requeued` with its last usage tick)."""

from __future__ import annotations

import logging
from datetime import datetime

from services.launcher import coordinator_core as core
from services.launcher import repo
from shared.db import Conn, outbox_add
from shared.events import JobFinished, JobRequeued, UsageTicked
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.states import JobState

log = logging.getLogger(__name__)


async def end_run(
    conn: Conn, spec: JobSpec, run: repo.Run, end: repo.Ending, now: datetime
) -> None:
    used = await repo.finish(conn, run, end, now)
    model = await repo.gpu_model(conn, list(run.nodes))
    if end.state == JobState.REQUEUED:
        requeued = JobRequeued(
            job_id=run.job_id, attempt=run.attempt, reason=end.reason,
            excluded_nodes=end.excluded, restart_count=end.restart_count, gpu_seconds=used,
            user=spec.user, account=spec.account,
        )  # fmt: skip
        tick = UsageTicked(
            job_id=run.job_id, attempt=run.attempt, user=spec.user, account=spec.account,
            gpu_model=model, gpu_seconds_total=used,
        )  # fmt: skip
        await outbox_add(conn, requeued, tick)
    else:
        finished = JobFinished(
            job_id=run.job_id, attempt=run.attempt, state=end.state, user=spec.user,
            account=spec.account, reason=end.reason, exit_code=end.exit_code,
            signal=end.signal, gpu_seconds=used, gpu_model=model,
            started_at=run.started_at, ended_at=now,
        )  # fmt: skip
        await outbox_add(conn, finished)
    log.info("job ended", extra=kv(job=run.job_id, state=end.state, reason=end.reason))


async def end_unstarted(conn: Conn, spec: JobSpec, job_id: int, reason: str, now: datetime) -> None:
    """A job cancelled before any worker of it started."""
    await repo.finish_unstarted(conn, job_id, JobState.CANCELLED, reason, now)
    finished = JobFinished(
        job_id=job_id, attempt=0, state=JobState.CANCELLED, user=spec.user,
        account=spec.account, reason=reason,
    )  # fmt: skip
    await outbox_add(conn, finished)


def decided_ending(action: core.Requeue | core.Finish, after: core.JobRun) -> repo.Ending:
    if isinstance(action, core.Requeue):
        return repo.Ending(
            state=JobState.REQUEUED, reason=action.reason, restart_count=action.restart_count,
            excluded=action.excluded_nodes,
        )  # fmt: skip
    return repo.Ending(
        state=action.state, reason=action.reason, exit_code=action.exit_code,
        signal=action.signal, restart_count=after.restart_count, excluded=after.excluded_nodes,
    )  # fmt: skip


def ending(run: repo.Run, state: JobState, reason: str) -> repo.Ending:
    return repo.Ending(
        state=state, reason=reason, restart_count=run.restart_count, excluded=run.excluded
    )
