"""Pure: database rows -> the API's views (job state and reason, node GPUs)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from shared.api import GpuView, JobView, NodeView, StepView
from shared.gpu_types import type_of
from shared.states import LIVE_RUN, TERMINAL, JobState


class Row(Protocol):
    def __getitem__(self, key: str, /) -> Any: ...


WHY = {
    "PRIORITY": "jobs of higher priority are ahead of it for the resources it needs",
    "RESOURCES": "not enough free GPUs or nodes right now",
    "TOPOLOGY": "it fits, but not inside the switches it asked for yet",
    "RESERVATION": "it would run into a reservation or maintenance window",
    "NODES_EXCLUDED": "the nodes it may use are excluded or unhealthy",
    "HELD": "it is held; `muster release` lets it run",
    "HELD_ADMIN": "an operator held it; only an operator can release it",
    "APPROVAL": "its partition needs an operator's approval first (`muster approve`)",
    "DEPENDENCY": "it waits for the jobs it depends on",
    "DEPENDENCY_NEVER_SATISFIED": "a job it depends on ended so that it can never run;"
    " cancel it or change its --dependency",
    "SINGLETON": "an earlier job of the same name and user has not ended yet",
    "JOB_ARRAY_TASK_LIMIT": "its array already runs as many tasks as its %K allows",
    "BEGIN_TIME": "its --begin time has not come yet",
    "PREEMPTING": "lower-priority jobs are being preempted to make room",
    "BAD_CONSTRAINTS": "no node in the cluster could ever run it as asked",
}


# The waits a job's own --dependency causes (`squeue %E` shows it for these alone)
DEPENDENCY_WAITS = frozenset({"DEPENDENCY", "DEPENDENCY_NEVER_SATISFIED", "SINGLETON"})


def job_state(row: Row) -> tuple[str, str]:
    """(state, reason) of one job row as `muster queue` shows it."""
    run = row["run_state"]
    if run in TERMINAL:
        return run, row["run_reason"] or ""
    if row["cancel_requested_at"] is not None and run in (None, JobState.REQUEUED):
        return JobState.CANCELLED, row["cancel_reason"] or "cancelled"
    preempted_for = _column(row, "preempted_for")
    if preempted_for is not None and (run in LIVE_RUN or row["alloc_nodes"]):
        # its workers are being stopped for another job (then requeued or ended): not
        # RUNNING as if nothing happened, nor CONFIGURING while its allocation is let go
        return JobState.COMPLETING, f"PREEMPTED: for job {preempted_for}"
    if run in LIVE_RUN:
        return run, row["run_reason"] or ""
    if row["alloc_nodes"]:
        return JobState.CONFIGURING, "allocated, starting workers"
    if row["held"]:
        return JobState.PENDING, "HELD_ADMIN" if row["held_by_operator"] else "HELD"
    if row["needs_approval"] and not row["approved"]:
        return JobState.PENDING, "APPROVAL"
    reason = row["wait_reason"] or "PRIORITY"
    if run == JobState.REQUEUED:
        return JobState.PENDING, f"{reason} (requeued: {row['run_reason']})"
    return JobState.PENDING, reason


def _column(row: Row, name: str) -> int | None:
    """An optional number column (rows read without it have none): the job a live
    preemption of its allocation makes room for, an array task's throttle."""
    try:
        value = row[name]
    except KeyError:
        return None
    return None if value is None else int(value)


def job_view(row: Row, now: float) -> JobView:
    """One job row as the API shows it; `now` (the caller's one clock reading) ends the
    elapsed time of a job still running."""
    state, reason = job_state(row)
    started, ended = row["started"], row["ended"]
    nodelist = tuple(row["run_nodes"] or row["alloc_nodes"] or ())
    elapsed = 0.0
    if started is not None and row["run_state"] == JobState.REQUEUED:
        # back in the queue: the time it ran, not a clock that keeps counting while it waits
        elapsed = float((row["run_updated"] or started) - started)
    elif started is not None:
        elapsed = float((ended if ended is not None else now) - started)
    held = row["alloc_gpus"] or 0  # an exclusive job holds every GPU of its nodes
    return JobView(
        job_id=row["job_id"],
        name=row["name"],
        user=row["user_name"],
        account=row["account"],
        partition=row["partition"],
        qos=row["qos"],
        state=state,
        reason=reason,
        nodes=len(nodelist) or row["nodes_max"],
        gpus=held or (len(nodelist) or row["nodes_max"]) * row["gpus_per_node"],
        nodelist=nodelist if state != JobState.PENDING else (),
        submitted_at=float(row["submitted"]),
        started_at=None if started is None else float(started),
        ended_at=None if ended is None else float(ended),
        time_limit_s=row["time_limit_s"],
        elapsed_s=round(elapsed, 3),
        exit_code=row["exit_code"],
        restart_count=row["restart_count"] or 0,
        estimated_start=None if row["est"] is None else float(row["est"]),
        array_job_id=row["array_job_id"],
        array_task_id=row["array_task_id"],
        array_max_running=_column(row, "array_throttle"),
        detail=row["wait_detail"] or "",
    )


def why_pending(view: JobView) -> str:
    if view.state != JobState.PENDING:
        return ""
    code = view.reason.split(" ", 1)[0]
    text = WHY.get(code, code.replace("_", " ").lower())
    return f"{code}: {text}" + (f" ({view.detail})" if view.detail else "")


def node_views(nodes: Sequence[Row], gpus: Sequence[Row]) -> list[NodeView]:
    by_node: dict[str, list[GpuView]] = {}
    for g in gpus:
        by_node.setdefault(g["node"], []).append(
            GpuView(
                index=g["idx"],
                model=g["model"],
                healthy=g["healthy"],
                allocated_to=g["job_id"],
                last_xid=g["last_xid"],
            )
        )
    out = []
    for n in nodes:
        slots = by_node.get(n["name"], [])
        free = sum(1 for s in slots if s.healthy and s.allocated_to is None)
        out.append(
            NodeView(
                name=n["name"],
                state=n["state"],
                reason=n["reason"],
                gpus_total=len(slots),
                gpus_free=free if n["state"] == "UP" else 0,
                topology=tuple(n["topology"]),
                features=tuple(dict.fromkeys(n["features"] or ())),
                gpu_type=type_of(slots[0].model if slots else None, n["gpu_type"]),
                last_heartbeat=None if n["hb"] is None else float(n["hb"]),
                last_fault=None if n["last_fault"] is None else json.loads(n["last_fault"]),
                gpus=tuple(slots),
                cpus=n["cpus"],
                memory_mib=n["memory_mib"],
                state_since=n["since"],
                cpus_alloc=n["cpus_alloc"],
                mem_alloc_mib=n["mem_alloc"],
            )
        )
    return out


def step_view(row: Any) -> StepView:
    """One `job_steps` row (the launcher's; docs/steps.md) as `muster show job` lists it."""
    return StepView(
        job_id=row.get("job_id", 0),  # queued with its job, not in a job's own show
        step_id=row["step_id"],
        argv=tuple(row["argv"]),
        nodes=tuple(row["nodes"]),
        ntasks=row["ntasks"],
        state=row["state"],
        exit_code=row["exit_code"],
        started_at=float(row["started"]),
        ended_at=None if row["ended"] is None else float(row["ended"]),
        gpus=msgspec.json.decode(row["gpus"] or "{}", type=dict[str, tuple[int, ...]]),
    )
