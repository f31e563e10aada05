"""`muster.sprio`: each pending job's priority and factors in Slurm's sprio columns."""

from __future__ import annotations

from typing import Any

from muster.sprio import sprio_lines
from shared.api import JobView

FACTORS = {"total": 1646.4, "age": 17.2, "fairshare": 1429.0, "jobsize": 0.0,
           "partition": 100.0, "qos": 100.0, "nice": 0.0}  # fmt: skip


def job(job_id: int, **kw: Any) -> JobView:
    base: dict[str, Any] = dict(
        job_id=job_id, name="train", user="ada", account="ml", partition="gpu", qos="normal",
        state="PENDING", reason="PRIORITY", nodes=1, gpus=8, nodelist=(), submitted_at=0.0,
        started_at=None, ended_at=None, time_limit_s=3600, elapsed_s=0.0, exit_code=None,
        restart_count=0, priority=FACTORS,
    )  # fmt: skip
    return JobView(**(base | kw))


def test_slurms_columns_a_line_per_ranked_job_by_id() -> None:
    unranked = job(5, priority={})  # just submitted: fairshare has not ranked it
    assert sprio_lines([job(9), unranked, job(7)], None, False, True) == [
        "          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE    JOBSIZE"
        "  PARTITION        QOS",
        "              7 gpu             1646          0         17       1429          0"
        "        100        100",
        "              9 gpu             1646          0         17       1429          0"
        "        100        100",
    ]


def test_l_adds_the_user_and_nice_and_o_picks_the_columns() -> None:
    assert sprio_lines([job(7)], None, True, False)[0].split() == [
        "7", "gpu", "ada", "1646", "0", "17", "1429", "0", "100", "100", "0"
    ]  # fmt: skip
    assert sprio_lines([job(7)], "%i|%Y|%F", False, False) == ["7|1646|1429"]
