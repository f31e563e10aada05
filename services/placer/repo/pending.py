"""Placer SQL, the queue: jobs waiting for an allocation, and the facts their blockers
are decided on (`core/blockers.py`).

Every function takes a connection already inside the cycle's transaction. The facts are
loaded, never judged here: which dependency holds, whether the begin time has come and
how many array tasks may start is the core's to say.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from services.placer.core import JobRequest
from services.placer.core.blockers import Ended, Facts
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.node_size import per_node, whole_memory
from shared.states import TERMINAL, JobState
from shared.waiting import fetch_waiting

TERMINAL_STATES = sorted(TERMINAL)  # as a query parameter (`= ANY($n::text[])`)


class PendingJob(msgspec.Struct, frozen=True, kw_only=True):
    request: JobRequest  # without a blocker, a priority or run exclusions: the cycle adds those
    attempt: int  # the attempt number its next allocation gets
    spec: JobSpec
    run_excluded: tuple[str, ...] = ()  # the nodes the launcher requeued it without
    requeued_at: float | None = None  # when (its run row's last write)
    version: int = 0  # admission's count of changes to its placement fields (0031)


async def load_pending(conn: Conn) -> list[PendingJob]:
    """Jobs waiting for an allocation, in job id order."""
    rows = await fetch_waiting(
        conn,
        "j.job_id, j.spec, j.held, extract(epoch FROM j.submitted_at)::float8 AS submitted,"
        " coalesce(r.excluded_nodes, '{}') AS run_excluded, r.state = $1 AS requeued,"
        " extract(epoch FROM r.updated_at)::float8 AS requeued_at,"
        " (SELECT coalesce(max(attempt), 0) FROM allocations a WHERE a.job_id = j.job_id) AS last,"
        # admission's policy columns (migration 0004)
        " j.needs_approval AND j.approved_at IS NULL AS unapproved, j.tier, j.preemptible,"
        " j.can_preempt, j.grace_s, j.min_runtime_s, j.spec_version",
    )
    out = []
    for r in rows:
        spec = msgspec.json.decode(r["spec"], type=JobSpec)
        out.append(
            PendingJob(
                request=_request(r, spec),
                attempt=r["last"] + 1,
                spec=spec,
                run_excluded=tuple(r["run_excluded"]),
                requeued_at=r["requeued_at"],
                version=r["spec_version"],
            )
        )
    return out


async def changed_since(conn: Conn, versions: dict[int, int]) -> set[int]:
    """Those of these jobs whose placement fields admission changed since the queue was
    read (`versions`: each job's count then). Read after the cycle's allocations are
    written: an update that held the job's row made their insert wait, so this read
    sees it."""
    if not versions:
        return set()
    rows = await conn.fetch(
        "SELECT j.job_id FROM jobs j"
        " JOIN unnest($1::bigint[], $2::int[]) AS x(job_id, version) USING (job_id)"
        " WHERE j.spec_version <> x.version",
        list(versions),
        list(versions.values()),
    )
    return {r["job_id"] for r in rows}


async def load_up_since(conn: Conn) -> dict[str, float]:
    """Each UP node's time of coming UP (what lifts a run's exclusion of it)."""
    rows = await conn.fetch(
        "SELECT name, extract(epoch FROM state_since)::float8 AS since FROM nodes"
        " WHERE state = 'UP'"
    )
    return {r["name"]: r["since"] for r in rows}


def _request(row: asyncpg.Record, spec: JobSpec) -> JobRequest:
    cpus, mib = per_node(spec)
    return JobRequest(
        job_id=row["job_id"],
        user=spec.user,
        account=spec.account,
        partition=spec.partition,
        qos=spec.qos,
        submitted_at=float(row["submitted"]),
        nodes_min=spec.nodes_min,
        nodes_max=spec.nodes_max,
        gpus_per_node=spec.gpus_per_node,
        gpus_total=spec.gpus_total,
        gpu_model=spec.gpu_model,
        constraint=spec.constraint,
        exclusive=spec.exclusive,
        required_nodes=spec.required_nodes,
        excluded_nodes=spec.excluded_nodes,
        cpus_per_node=cpus,
        mem_per_node_mib=mib,
        mem_whole=whole_memory(spec),
        time_limit_s=spec.time_limit_s,
        max_switches=spec.max_switches,
        switches_wait_s=spec.switches_wait_s,
        # a user's hold, or a partition's approval not yet given (admission's columns)
        held=bool(row["held"]) or bool(row["unapproved"]),
        requeued=bool(row["requeued"]),
        tier=row["tier"],
        preemptible=row["preemptible"],
        can_preempt=row["can_preempt"],
        grace_s=row["grace_s"],
        min_runtime_s=row["min_runtime_s"],
        name=spec.name,
    )


async def load_blocker_facts(conn: Conn, jobs: Sequence[tuple[int, JobSpec]]) -> Facts:
    """What `blockers()` needs to judge these jobs' dependencies and array throttles."""
    ended, tasks, task_ids = await _depended_on(conn, jobs)
    return Facts(
        jobs=ended,
        tasks=tasks,
        task_ids=task_ids,
        first_live=await _first_live(conn, jobs),
        array_running=await _array_running(conn, jobs),
    )


async def _depended_on(
    conn: Conn, jobs: Sequence[tuple[int, JobSpec]]
) -> tuple[dict[int, Ended], dict[int, tuple[int, ...]], dict[tuple[int, int], int]]:
    """How each job named in a dependency (and each task of a named array) stands; each
    array's tasks, and by index (what aftercorr's task T waits for)."""
    ids = sorted({i for _, s in jobs for d in s.dependencies for i in d.job_ids})
    if not ids:
        return {}, {}, {}
    rows = await conn.fetch(
        "SELECT j.job_id, j.array_job_id, j.array_task_id, r.state,"
        " j.cancel_requested_at IS NOT NULL AS cxl,"
        " extract(epoch FROM r.started_at)::float8 AS started"
        " FROM jobs j LEFT JOIN job_runs r USING (job_id)"
        " WHERE j.job_id = ANY($1::bigint[]) OR j.array_job_id = ANY($1::bigint[])",
        ids,
    )
    ended: dict[int, Ended] = {}
    tasks: dict[int, tuple[int, ...]] = {}
    task_ids: dict[tuple[int, int], int] = {}
    for r in rows:
        state = None if r["state"] is None else JobState(r["state"])
        end = state if state in TERMINAL else None
        if end is None and r["cxl"] and state in (None, JobState.REQUEUED):
            end = JobState.CANCELLED  # cancelled before it ran: it ended, not COMPLETED
        ended[r["job_id"]] = Ended(end=end, started_at=r["started"])
        if r["array_job_id"] is not None:
            tasks[r["array_job_id"]] = (*tasks.get(r["array_job_id"], ()), r["job_id"])
            task_ids[(r["array_job_id"], r["array_task_id"])] = r["job_id"]
    return ended, tasks, task_ids


async def _first_live(
    conn: Conn, jobs: Sequence[tuple[int, JobSpec]]
) -> dict[tuple[str, str], int]:
    """The earliest unfinished job of each (user, name) some singleton job waits on."""
    pairs = sorted(
        {(s.user, s.name) for _, s in jobs if any(d.kind == "singleton" for d in s.dependencies)}
    )
    if not pairs:
        return {}
    rows = await conn.fetch(
        "SELECT j.user_name, j.name, min(j.job_id) AS first FROM jobs j"
        " LEFT JOIN job_runs r USING (job_id)"
        " WHERE (j.user_name, j.name) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
        " AND j.cancel_requested_at IS NULL AND (r.state IS NULL OR NOT r.state = ANY($3))"
        " GROUP BY 1, 2",
        [p[0] for p in pairs],
        [p[1] for p in pairs],
        TERMINAL_STATES,
    )
    return {(r["user_name"], r["name"]): r["first"] for r in rows}


async def _array_running(conn: Conn, jobs: Sequence[tuple[int, JobSpec]]) -> dict[int, int]:
    """Tasks holding a live allocation, per array that has a `%K` throttle."""
    heads = sorted(
        {s.array_job_id for _, s in jobs if s.array_max_running and s.array_job_id is not None}
    )
    if not heads:
        return {}
    rows = await conn.fetch(
        "SELECT j.array_job_id, count(*) AS n FROM allocations a JOIN jobs j USING (job_id)"
        " WHERE a.released_at IS NULL AND j.array_job_id = ANY($1::bigint[]) GROUP BY 1",
        heads,
    )
    return {r["array_job_id"]: r["n"] for r in rows}
