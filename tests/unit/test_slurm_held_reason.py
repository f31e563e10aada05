"""squeue shows a job's reason by Slurm's names (`JobHeldUser` after `scontrol hold` or
`requeuehold`, `Resources`, `Priority`, `JobArrayTaskLimit`...), as Slurm users' scripts
and dashboards test `%r` for them; a job that ran, by how it ended."""

from __future__ import annotations

import pytest

from muster.slurm_format import reason, reason_list
from shared.api import JobView


def pending(why: str, state: str = "PENDING") -> JobView:
    return JobView(
        job_id=7, name="train", user="alice", account="ml", partition="gpu", qos="normal",
        state=state, reason=why, nodes=1, gpus=1, nodelist=(), submitted_at=0.0,
        started_at=None, ended_at=None, time_limit_s=60, elapsed_s=0.0, exit_code=None,
        restart_count=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("why", "want"),
    [
        ("HELD", "JobHeldUser"),
        ("HELD_ADMIN", "JobHeldAdmin"),
        ("RESOURCES (requeued: requeued by alice)", "Resources"),
        ("PRIORITY behind job 5", "Priority"),
        ("JOB_ARRAY_TASK_LIMIT 2 of its tasks run", "JobArrayTaskLimit"),
        ("QOS_MAX_JOBS_PER_USER", "QOSMaxJobsPerUserLimit"),
        ("BEGIN_TIME", "BeginTime"),
        ("TOPOLOGY not within 1 leaf switches yet", "TOPOLOGY"),  # Slurm has no name
        ("", "None"),
    ],
)
def test_a_held_job_reads_as_slurm_names_its_hold(why: str, want: str) -> None:
    assert (reason(pending(why)), reason_list(pending(why))) == (want, f"({want})")


@pytest.mark.parametrize(
    ("state", "why", "want"),
    [
        ("COMPLETED", "the batch script on node01 exited 0", "None"),
        ("RUNNING", "", "None"),
        ("FAILED", "all 2 workers exited 3", "NonZeroExitCode"),
        ("TIMEOUT", "time limit 0:10:00 reached", "TimeLimit"),
        ("CANCELLED", "cancelled by alice", "None"),
    ],
)
def test_a_job_that_ran_reads_as_how_it_ended(state: str, why: str, want: str) -> None:
    """Not the first word of its sentence (`%r` said "the" for a completed job)."""
    assert reason(pending(why, state)) == want
