"""squeue shows a held job's reason by Slurm's names (`JobHeldUser`, `JobHeldAdmin`),
as a Slurm user's scripts look for them after `scontrol hold` or `requeuehold`."""

from __future__ import annotations

import pytest

from muster.slurm_format import reason, reason_list
from shared.api import JobView


def pending(why: str) -> JobView:
    return JobView(
        job_id=7, name="train", user="alice", account="ml", partition="gpu", qos="normal",
        state="PENDING", reason=why, nodes=1, gpus=1, nodelist=(), submitted_at=0.0,
        started_at=None, ended_at=None, time_limit_s=60, elapsed_s=0.0, exit_code=None,
        restart_count=1,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("why", "want"),
    [
        ("HELD", "JobHeldUser"),
        ("HELD_ADMIN", "JobHeldAdmin"),
        ("RESOURCES (requeued: requeued by alice)", "RESOURCES"),
        ("", "None"),
    ],
)
def test_a_held_job_reads_as_slurm_names_its_hold(why: str, want: str) -> None:
    assert (reason(pending(why)), reason_list(pending(why))) == (want, f"({want})")
