"""The queue says what is true: the GPUs an exclusive job holds, and a requeued job's
TIME as the time it ran, not a clock that keeps counting while it waits again."""

from __future__ import annotations

from typing import Any

from services.admission.views import job_view

NOW = 10_000.0


def row(**given: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "job_id": 7, "name": "train", "user_name": "alice", "account": "research",
        "partition": "normal", "qos": "normal", "nodes_max": 2, "gpus_per_node": 0,
        "time_limit_s": 3600, "held": False, "array_job_id": None, "array_task_id": None,
        "held_by_operator": False, "hold_reason": None, "needs_approval": False,
        "approved_by": None, "approved": False, "submitted": 1000.0,
        "cancel_requested_at": None, "cancel_reason": None, "run_state": None,
        "run_reason": None, "run_nodes": None, "exit_code": None, "restart_count": 0,
        "started": None, "ended": None, "run_updated": None, "wait_reason": None,
        "wait_detail": None, "est": None, "alloc_nodes": None, "alloc_gpus": 0,
    }  # fmt: skip
    return base | given


def test_an_exclusive_job_shows_every_gpu_it_holds() -> None:
    running = row(
        run_state="RUNNING", run_nodes=["n1", "n2"], alloc_nodes=["n1", "n2"], alloc_gpus=16,
        started=NOW - 60,
    )  # fmt: skip
    view = job_view(running, NOW)
    assert (view.state, view.nodes, view.gpus) == ("RUNNING", 2, 16)


def test_a_pending_job_counts_what_it_asks() -> None:
    view = job_view(row(gpus_per_node=4), NOW)
    assert (view.state, view.gpus, view.elapsed_s) == ("PENDING", 8, 0.0)


def test_a_requeued_job_shows_the_time_it_ran_however_long_it_waits() -> None:
    requeued = row(
        run_state="REQUEUED", run_reason="preempted", started=NOW - 900, run_updated=NOW - 600
    )
    for later in (NOW, NOW + 3600):
        view = job_view(requeued, later)
        assert (view.state, view.elapsed_s) == ("PENDING", 300.0)
