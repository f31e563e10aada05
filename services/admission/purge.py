"""Admission SQL: finished jobs are purged once they ended longer ago than the cluster
keeps them (`MUSTER_JOB_KEEP_S`, a year by default; Slurm's PurgeJobAfter).

Admission keeps the job record from its submission to its purge. The purge is one
function in the database (migration 0027), which removes a batch of jobs with every row
about them, in every service's tables, in one transaction: no reader sees half a job.
Only admission's role may call it, and the function itself refuses what no setting may
ask: a job that has not finished, or that ended less than 8 days ago (an event about it
might still be redelivered, and the inbox that makes such an event a no-op keeps rows
that long: `shared/retention.py` INBOX_FLOOR_S). Admission's pruner calls it in bounded
batches, with the outbox and the inbox.

What a purge changes for users: `muster show job` and `sacct` no longer find the job,
and a new submission depending on it is refused. A job a waiting job depends on is
kept while that job waits (its end is what the dependency is judged by). Fair share is
unchanged (`usage` holds the charged totals, not per-job rows), and so is the hourly
usage report (`usage_hours`, kept on its own).
"""

from __future__ import annotations

# $1: seconds to keep a finished job after its end (the setting, floored at
# `shared/retention.py` INBOX_FLOOR_S here and in the function); $2: most jobs removed,
# each with its rows. Returns how many jobs it removed.
PURGE_JOBS = "SELECT purge_finished_jobs($1::float8, $2::int)"


def kept_text(kept_s: float) -> str:
    """A keep in the unit an operator set it in: days, or hours under a day and a half."""
    days = kept_s / 86400
    return f"{days:.0f} days" if days >= 1.5 else f"{kept_s / 3600:.0f} hours"


def missing_job(job_id: int, kept_s: float | None) -> str:
    """What a request naming a job the database does not hold is told: with purging on,
    that a finished job may have been purged, and after how long."""
    if kept_s is None:
        return f"no such job: {job_id}"
    return (
        f"no such job: {job_id} (never submitted, or finished more than {kept_text(kept_s)}"
        " ago and purged)"
    )


def missing_dependencies(job_ids: list[int] | list[str], kept_s: float | None) -> str:
    """Why a submission whose --dependency names jobs (or array tasks, `12_3`) the
    database does not hold is refused (as Slurm's "Job dependency problem"), and what to
    check."""
    said = (
        f"--dependency names job(s) that do not exist: {', '.join(map(str, job_ids))};"
        " check the ids with `muster queue -a`"
    )
    if kept_s is None:
        return said
    return f"{said} (a finished job is purged {kept_text(kept_s)} after its end)"
