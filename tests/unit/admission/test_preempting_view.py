"""The queue says a job is being preempted: while a preemption of its live allocation
stands, a victim shows COMPLETING with the job it makes room for, not RUNNING as if
nothing happened, nor CONFIGURING ("allocated, starting workers") as its requeued run
waits for the allocation to be let go."""

from __future__ import annotations

from typing import Any

import pytest

from services.admission.views import job_state
from tests.unit.admission.test_queue_view import row

CASES: dict[str, tuple[dict[str, Any], tuple[str, str]]] = {
    "a victim still running shows it is being stopped, and for whom": (
        dict(run_state="RUNNING", run_nodes=["n1"], alloc_nodes=["n1"], preempted_for=12),
        ("COMPLETING", "PREEMPTED: for job 12"),
    ),
    "its workers stopping: the same": (
        dict(run_state="COMPLETING", run_nodes=["n1"], alloc_nodes=["n1"], preempted_for=12),
        ("COMPLETING", "PREEMPTED: for job 12"),
    ),
    "requeued while its allocation is still let go: not CONFIGURING": (
        dict(run_state="REQUEUED", run_reason="preempted", alloc_nodes=["n1"], preempted_for=12),
        ("COMPLETING", "PREEMPTED: for job 12"),
    ),
    "requeued and the allocation released: pending again, saying why": (
        dict(run_state="REQUEUED", run_reason="preempted", preempted_for=None),
        ("PENDING", "PRIORITY (requeued: preempted)"),
    ),
    "preempted and ended (cancel mode): the end is shown": (
        dict(run_state="PREEMPTED", run_reason="preempted for job 12", preempted_for=12),
        ("PREEMPTED", "preempted for job 12"),
    ),
    "no preemption: a running job runs": (
        dict(run_state="RUNNING", run_nodes=["n1"], alloc_nodes=["n1"], preempted_for=None),
        ("RUNNING", ""),
    ),
}


@pytest.mark.parametrize(("given", "want"), CASES.values(), ids=CASES.keys())
def test_job_state_while_preempted(given: dict[str, Any], want: tuple[str, str]) -> None:
    assert job_state(row(**given)) == want
