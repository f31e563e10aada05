"""Table tests: which worker a node agent's stop request names (agent.aimed_at)."""

from __future__ import annotations

import pytest

from services.launcher.agent import aimed_at
from services.launcher.worker_table import WorkerRecord
from shared.api import StopWorkers


def record(attempt: int, generation: int) -> WorkerRecord:
    return WorkerRecord(
        job_id=7, attempt=attempt, generation=generation, boot_id="b",
        folder="/tmp/x",
    )  # fmt: skip


CASES = [
    ("a stop by job alone hits whatever of the job runs", StopWorkers(job_id=7), True),
    (
        "a stop aimed at this attempt and generation hits it",
        StopWorkers(job_id=7, attempt=2, generation=1), True,
    ),
    (
        "a stop aimed at an older generation spares the newer worker",
        StopWorkers(job_id=7, attempt=2, generation=0), False,
    ),
    (
        "a stop aimed at an older attempt spares the newer allocation's worker",
        StopWorkers(job_id=7, attempt=1), False,
    ),
    (
        "a stop of any generation of this attempt hits it",
        StopWorkers(job_id=7, attempt=2), True,
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "req", "want"), CASES, ids=[c[0] for c in CASES])
def test_aimed_at(name: str, req: StopWorkers, want: bool) -> None:
    assert aimed_at(req, record(attempt=2, generation=1)) is want
