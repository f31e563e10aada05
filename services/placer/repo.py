"""Placer SQL. Every function takes a connection already inside a transaction.

The placer writes `placer_lease`, `allocations*`, `pending_reasons` and `placer_cycles`;
it reads the other services' tables to build its snapshot.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import asyncpg
import msgspec

from services.placer.core import (
    Gpu,
    Grant,
    JobRequest,
    Limits,
    Node,
    NodeState,
    QosLimit,
    Recurrence,
    Reservation,
    Running,
    Start,
    Wait,
)
from shared.db import Conn
from shared.jobspec import TERMINAL_STATES, JobSpec

TERMINAL = TERMINAL_STATES


async def acquire_lease(conn: Conn, holder: str, ttl_s: float) -> int | None:
    """Take the leader lease if it is free or expired; returns the new fencing epoch."""
    epoch: int | None = await conn.fetchval(
        "INSERT INTO placer_lease AS l (id, holder, epoch, expires_at)"
        " VALUES (1, $1, 1, now() + make_interval(secs => $2))"
        " ON CONFLICT (id) DO UPDATE SET holder = $1, epoch = l.epoch + 1,"
        "   expires_at = now() + make_interval(secs => $2)"
        " WHERE l.expires_at < now() RETURNING epoch",
        holder,
        ttl_s,
    )
    return epoch


async def renew_lease(conn: Conn, holder: str, epoch: int, ttl_s: float) -> bool:
    row = await conn.fetchval(
        "UPDATE placer_lease SET expires_at = now() + make_interval(secs => $3)"
        " WHERE id = 1 AND holder = $1 AND epoch = $2 RETURNING true",
        holder,
        epoch,
        ttl_s,
    )
    return bool(row)


async def lock_lease(conn: Conn, holder: str, epoch: int) -> bool:
    """Serialise cycles and check we still lead, for the rest of this transaction."""
    row = await conn.fetchval(
        "SELECT true FROM placer_lease WHERE id = 1 AND holder = $1 AND epoch = $2"
        " AND expires_at > now() FOR UPDATE",
        holder,
        epoch,
    )
    return bool(row)


async def release_finished(conn: Conn) -> int:
    """Release allocations whose run ended or was requeued (level-triggered)."""
    released = await conn.fetch(
        "UPDATE allocations a SET released_at = now(), release_reason = r.state"
        " FROM job_runs r WHERE a.job_id = r.job_id AND a.released_at IS NULL"
        " AND (r.state = ANY($1::text[]) OR (r.state = 'REQUEUED' AND r.attempt >= a.attempt))"
        " RETURNING a.alloc_id",
        list(TERMINAL),
    )
    cancelled = await conn.fetch(
        "UPDATE allocations a SET released_at = now(), release_reason = 'CANCELLED'"
        " FROM jobs j WHERE a.job_id = j.job_id AND a.released_at IS NULL"
        " AND j.cancel_requested_at IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM job_runs r WHERE r.job_id = a.job_id"
        "   AND r.attempt = a.attempt AND r.state IN ('STARTING', 'RUNNING', 'COMPLETING'))"
        " RETURNING a.alloc_id",
    )
    ids = [r["alloc_id"] for r in [*released, *cancelled]]
    if ids:
        await conn.execute(
            "UPDATE allocation_gpus SET live = false WHERE alloc_id = ANY($1::bigint[])", ids
        )
        await conn.execute(
            "UPDATE allocation_nodes SET live = false WHERE alloc_id = ANY($1::bigint[])", ids
        )
    return len(ids)


async def release_dropped_nodes(conn: Conn) -> int:
    """Give back the nodes an elastic job no longer runs on after a shrink. A granted
    spare is kept until the job's run lists it (its restart onto the spare)."""
    await conn.execute(
        "UPDATE allocation_nodes n SET spare_pending = false FROM allocations a, job_runs r"
        " WHERE n.alloc_id = a.alloc_id AND n.spare_pending AND r.job_id = a.job_id"
        " AND n.node = ANY(r.nodes)"
    )
    rows = await conn.fetch(
        "UPDATE allocation_nodes n SET live = false FROM allocations a, job_runs r"
        " WHERE n.alloc_id = a.alloc_id AND a.released_at IS NULL AND n.live"
        " AND (NOT n.spare_pending OR n.added_at < now() - interval '60 seconds')"
        " AND r.job_id = a.job_id AND r.attempt = a.attempt AND r.state = 'RUNNING'"
        " AND cardinality(r.nodes) > 0 AND NOT (n.node = ANY(r.nodes))"
        " RETURNING n.alloc_id, n.node",
    )
    for row in rows:
        await conn.execute(
            "UPDATE allocation_gpus SET live = false WHERE alloc_id = $1 AND node = $2",
            row["alloc_id"],
            row["node"],
        )
    return len(rows)


async def load_nodes(conn: Conn) -> tuple[Node, ...]:
    """Nodes with their GPUs and, when a cluster config is in force, the partitions
    each serves (a node no partition names serves none)."""
    policy = await conn.fetch("SELECT partition, nodes FROM partition_policy ORDER BY partition")
    rows = await conn.fetch(
        "SELECT n.name, n.state, n.topology,"
        f" {_gpu_column('idx', 'idx')}, {_gpu_column('model', 'model')},"
        f" {_gpu_column('memory_mib', 'mem')}, {_gpu_column('locality', 'loc')},"
        f" {_gpu_column('healthy', 'ok')}"
        " FROM nodes n LEFT JOIN gpus g ON g.node = n.name GROUP BY n.name ORDER BY n.name"
    )
    return tuple(
        Node(
            name=r["name"],
            state=_node_state(r["state"]),
            topology=tuple(r["topology"]),
            partitions=_partitions_of(r["name"], policy),
            gpus=tuple(
                Gpu(index=i, model=m, memory_mib=mem, locality=loc, healthy=ok)
                for i, m, mem, loc, ok in zip(
                    r["idx"], r["model"], r["mem"], r["loc"], r["ok"], strict=True
                )
            ),
        )
        for r in rows
    )


NO_PARTITION = ("(none)",)  # the core reads an empty tuple as "every partition"


def _partitions_of(node: str, policy: list[asyncpg.Record]) -> tuple[str, ...]:
    if not policy:
        return ()
    parts = tuple(p["partition"] for p in policy if p["nodes"] is None or node in p["nodes"])
    return parts or NO_PARTITION


async def load_reservations(conn: Conn) -> tuple[Reservation, ...]:
    """Advance reservations and maintenance windows, as admission published them."""
    rows = await conn.fetch("SELECT * FROM reservations ORDER BY name")
    return tuple(
        Reservation(
            name=r["name"],
            start=r["start_at"],
            duration_s=r["duration_s"],
            nodes=tuple(r["nodes"]),
            gpus=r["gpus"],
            accounts=tuple(r["accounts"]),
            recurrence=Recurrence(r["recurrence"].upper()),
            maintenance=r["maintenance"],
        )
        for r in rows
    )


async def load_kept(conn: Conn) -> dict[str, int]:
    """GPUs each partition keeps for its own jobs (`reserved_gpus` in the config)."""
    rows = await conn.fetch(
        "SELECT partition, reserved_gpus FROM partition_policy WHERE reserved_gpus > 0"
    )
    return {r["partition"]: r["reserved_gpus"] for r in rows}


async def load_limits(conn: Conn) -> Limits:
    """Running limits per QOS, as admission published them from the cluster config."""
    rows = await conn.fetch("SELECT * FROM qos_limits")
    return Limits(
        qos={
            r["qos"]: QosLimit(
                max_gpus_per_user=r["max_gpus_per_user"],
                max_jobs_per_user=r["max_jobs_per_user"],
                max_gpus_per_account=r["max_gpus_per_account"],
                max_jobs_per_account=r["max_jobs_per_account"],
            )
            for r in rows
        }
    )


def _gpu_column(column: str, alias: str) -> str:
    """One GPU column of a node as an array in index order (empty for GPU-less nodes)."""
    return (
        f"coalesce(array_agg(g.{column} ORDER BY g.idx) FILTER (WHERE g.idx IS NOT NULL), '{{}}')"
        f" AS {alias}"
    )


def _node_state(raw: str) -> NodeState:
    try:
        return NodeState(raw)
    except ValueError:
        return NodeState.DOWN


async def load_running(conn: Conn) -> tuple[Running, ...]:
    rows = await conn.fetch(
        "SELECT a.alloc_id, a.job_id, a.created_at, j.user_name, j.account, j.partition, j.qos,"
        " j.time_limit_s, r.started_at, j.tier, j.preemptible, j.grace_s, j.min_runtime_s,"
        " (SELECT p.for_job_id FROM preemptions p WHERE p.victim_alloc_id = a.alloc_id)"
        "   AS preempted_by,"
        " array_agg(n.node ORDER BY n.rank) AS nodes, array_agg(array_to_string(n.gpus, ',')"
        "   ORDER BY n.rank) AS gpus"
        " FROM allocations a JOIN jobs j USING (job_id)"
        " JOIN allocation_nodes n ON n.alloc_id = a.alloc_id AND n.live"
        " LEFT JOIN job_runs r ON r.job_id = a.job_id"
        " WHERE a.released_at IS NULL GROUP BY a.alloc_id, j.job_id, r.started_at"
    )
    return tuple(
        Running(
            job_id=r["job_id"],
            user=r["user_name"],
            account=r["account"],
            partition=r["partition"],
            qos=r["qos"],
            started_at=(r["started_at"] or r["created_at"]).timestamp(),
            time_limit_s=r["time_limit_s"],
            tier=r["tier"],
            preemptible=r["preemptible"],
            grace_s=r["grace_s"],
            min_runtime_s=r["min_runtime_s"],
            preempted_by=r["preempted_by"],
            grants=tuple(
                Grant(node=node, gpus=tuple(int(g) for g in gpus.split(",") if g))
                for node, gpus in zip(r["nodes"], r["gpus"], strict=True)
            ),
        )
        for r in rows
    )


async def load_pending(conn: Conn) -> list[tuple[JobRequest, int]]:
    """Jobs waiting for an allocation, with the attempt number their next one gets."""
    rows = await conn.fetch(
        "SELECT j.job_id, j.spec, j.held, extract(epoch FROM j.submitted_at)::float8 AS submitted,"
        " coalesce(r.excluded_nodes, '{}') AS run_excluded, r.state = 'REQUEUED' AS requeued,"
        " (SELECT coalesce(max(attempt), 0) FROM allocations a WHERE a.job_id = j.job_id) AS last,"
        # admission's policy columns (migration 0004)
        " j.needs_approval AND j.approved_at IS NULL AS unapproved, j.tier, j.preemptible,"
        " j.can_preempt, j.grace_s, j.min_runtime_s"
        " FROM jobs j LEFT JOIN job_runs r USING (job_id)"
        " WHERE j.cancel_requested_at IS NULL"
        " AND (r.state IS NULL OR r.state IN ('PENDING', 'REQUEUED'))"
        " AND NOT EXISTS (SELECT 1 FROM allocations a"
        "   WHERE a.job_id = j.job_id AND a.released_at IS NULL)"
        " ORDER BY j.job_id"
    )
    specs = [(r, msgspec.json.decode(r["spec"], type=JobSpec)) for r in rows]
    blocked = await _blocked(conn, [(r["job_id"], spec) for r, spec in specs], time.time())
    return [
        (_request(r["job_id"], spec, r, blocked.get(r["job_id"])), r["last"] + 1)
        for r, spec in specs
    ]


def _request(job_id: int, spec: JobSpec, row: object, blocked_by: str | None = None) -> JobRequest:
    assert hasattr(row, "__getitem__")
    excluded = tuple(sorted({*spec.excluded_nodes, *row["run_excluded"]}))
    return JobRequest(
        job_id=job_id,
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
        exclusive=spec.exclusive,
        required_nodes=spec.required_nodes,
        excluded_nodes=excluded,
        time_limit_s=spec.time_limit_s,
        max_switches=spec.max_switches,
        switches_wait_s=spec.switches_wait_s,
        # a user's hold, or a partition's approval not yet given (admission's columns)
        held=bool(row["held"]) or bool(row["unapproved"]),
        requeued=bool(row["requeued"]),
        blocked_by=blocked_by,
        tier=row["tier"],
        preemptible=row["preemptible"],
        can_preempt=row["can_preempt"],
        grace_s=row["grace_s"],
        min_runtime_s=row["min_runtime_s"],
    )


# --- what blocks a pending job besides resources (admission's side of load_pending):
# --begin, --dependency and the array throttle %K. Slurm's wording in the reasons.


async def _blocked(conn: Conn, jobs: list[tuple[int, JobSpec]], now: float) -> dict[int, str]:
    out: dict[int, str] = {}
    for job_id, spec in jobs:
        if spec.begin_at is not None and spec.begin_at > now:
            when = datetime.fromtimestamp(spec.begin_at, UTC).strftime("%Y-%m-%dT%H:%M:%S")
            out[job_id] = f"BeginTime: not before {when} UTC"
    waiting = [(j, s) for j, s in jobs if s.dependencies and j not in out]
    if waiting:
        deps = await _dependency_states(conn, waiting)
        for job_id, spec in waiting:
            why = _dependency_block(job_id, spec, deps, now)
            if why is not None:
                out[job_id] = why
    await _throttle(conn, [(j, s) for j, s in jobs if s.array_max_running and j not in out], out)
    return out


class _Dep(msgspec.Struct, frozen=True):
    states: dict[int, tuple[str | None, float | None]]  # job -> (end state, started)
    tasks: dict[int, list[int]]  # array head -> its task jobs
    first_live: dict[tuple[str, str], int]  # (user, name) -> earliest unfinished job


async def _dependency_states(conn: Conn, jobs: list[tuple[int, JobSpec]]) -> _Dep:
    ids = sorted({i for _, s in jobs for d in s.dependencies for i in d.job_ids})
    rows = await conn.fetch(
        "SELECT j.job_id, j.array_job_id, r.state, j.cancel_requested_at IS NOT NULL AS cxl,"
        " extract(epoch FROM r.started_at)::float8 AS started"
        " FROM jobs j LEFT JOIN job_runs r USING (job_id)"
        " WHERE j.job_id = ANY($1::bigint[]) OR j.array_job_id = ANY($1::bigint[])",
        ids,
    )
    states: dict[int, tuple[str | None, float | None]] = {}
    tasks: dict[int, list[int]] = {}
    for r in rows:
        end = r["state"] if r["state"] in TERMINAL else None
        if end is None and r["cxl"] and r["state"] in (None, "PENDING", "REQUEUED"):
            end = "CANCELLED"
        states[r["job_id"]] = (end, r["started"])
        if r["array_job_id"] is not None:
            tasks.setdefault(r["array_job_id"], []).append(r["job_id"])
    pairs = sorted(
        {(s.user, s.name) for _, s in jobs if any(d.kind == "singleton" for d in s.dependencies)}
    )
    first_live: dict[tuple[str, str], int] = {}
    if pairs:
        live = await conn.fetch(
            "SELECT j.user_name, j.name, min(j.job_id) AS first FROM jobs j"
            " LEFT JOIN job_runs r USING (job_id)"
            " WHERE (j.user_name, j.name) IN (SELECT * FROM unnest($1::text[], $2::text[]))"
            " AND j.cancel_requested_at IS NULL AND (r.state IS NULL OR NOT r.state = ANY($3))"
            " GROUP BY 1, 2",
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            list(TERMINAL),
        )
        first_live = {(r["user_name"], r["name"]): r["first"] for r in live}
    return _Dep(states=states, tasks=tasks, first_live=first_live)


def _dependency_block(job_id: int, spec: JobSpec, deps: _Dep, now: float) -> str | None:
    """None when the dependencies hold; else why not (DependencyNeverSatisfied when one
    can no longer hold: an afterok job failed, an afternotok job succeeded)."""
    verdicts: list[tuple[str, str]] = []  # ("ok" | "wait" | "never", term)
    for dep in spec.dependencies:
        if dep.kind == "singleton":
            first = deps.first_live.get((spec.user, spec.name), job_id)
            verdicts.append(("ok" if first >= job_id else "wait", f"singleton (job {first})"))
            continue
        for dep_id in dep.job_ids:
            members = deps.tasks.get(dep_id) or [dep_id]
            known = [deps.states[m] for m in members if m in deps.states]
            verdicts.append((_verdict(dep.kind, dep.delay_s, known, now), f"{dep.kind}:{dep_id}"))
    kinds = [v for v, _ in verdicts]
    if (spec.dependency_any and "ok" in kinds) or all(k == "ok" for k in kinds):
        return None
    if ("never" in kinds and not spec.dependency_any) or all(k == "never" for k in kinds):
        never = ", ".join(t for v, t in verdicts if v == "never")
        return f"DependencyNeverSatisfied: {never} can no longer be met"
    return "Dependency: waiting for " + ", ".join(t for v, t in verdicts if v != "ok")


def _verdict(
    kind: str, delay_s: int, states: list[tuple[str | None, float | None]], now: float
) -> str:
    ends = [end for end, _ in states]
    if kind == "after":
        started = [
            end is not None or (st is not None and st + delay_s <= now) for end, st in states
        ]
        return "ok" if all(started) else "wait"
    if kind == "afterany":
        return "ok" if all(e is not None for e in ends) else "wait"
    if kind == "afterok":
        if any(e is not None and e != "COMPLETED" for e in ends):
            return "never"
        return "ok" if all(e == "COMPLETED" for e in ends) else "wait"
    if kind == "afternotok":
        if any(e is None for e in ends):
            return "wait"
        return "ok" if any(e != "COMPLETED" for e in ends) else "never"
    return "ok"  # an unknown kind never blocks (admission refuses them)


async def _throttle(conn: Conn, tasks: list[tuple[int, JobSpec]], out: dict[int, str]) -> None:
    """`--array=...%K`: at most K tasks of an array hold an allocation at once."""
    if not tasks:
        return
    heads = sorted({s.array_job_id for _, s in tasks if s.array_job_id is not None})
    rows = await conn.fetch(
        "SELECT j.array_job_id, count(*) AS n FROM allocations a JOIN jobs j USING (job_id)"
        " WHERE a.released_at IS NULL AND j.array_job_id = ANY($1::bigint[]) GROUP BY 1",
        heads,
    )
    room = {r["array_job_id"]: r["n"] for r in rows}
    for job_id, spec in sorted(tasks, key=lambda t: t[0]):
        head, limit = spec.array_job_id, spec.array_max_running or 0
        running = room.get(head, 0)
        if running >= limit:
            out[job_id] = f"JobArrayTaskLimit: {running} of at most {limit} tasks running"
        else:
            room[head] = running + 1  # this one may start: the next in line counts it


async def insert_allocation(conn: Conn, start: Start, attempt: int, epoch: int) -> int:
    """Write one gang's allocation; the unique index refuses a GPU held twice."""
    alloc_id: int = await conn.fetchval(
        "INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, $2, $3) RETURNING alloc_id",
        start.job_id,
        attempt,
        epoch,
    )
    await conn.executemany(
        "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus) VALUES ($1, $2, $3, $4)",
        [(alloc_id, g.node, rank, list(g.gpus)) for rank, g in enumerate(start.grants)],
    )
    await conn.executemany(
        "INSERT INTO allocation_gpus(alloc_id, node, gpu) VALUES ($1, $2, $3)",
        [(alloc_id, g.node, gpu) for g in start.grants for gpu in g.gpus],
    )
    await conn.execute("DELETE FROM pending_reasons WHERE job_id = $1", start.job_id)
    return alloc_id


async def write_waits(conn: Conn, waits: tuple[Wait, ...]) -> None:
    await conn.executemany(
        "INSERT INTO pending_reasons(job_id, reason, detail, estimated_start, updated_at)"
        " VALUES ($1, $2, $3, $4, now()) ON CONFLICT (job_id) DO UPDATE SET"
        " reason = excluded.reason, detail = excluded.detail,"
        " estimated_start = excluded.estimated_start, updated_at = now()",
        [
            (
                w.job_id,
                str(w.reason),
                w.detail,
                datetime.fromtimestamp(w.estimated_start, UTC) if w.estimated_start else None,
            )
            for w in waits
        ],
    )


async def record_cycle(
    conn: Conn,
    epoch: int,
    cycle: int,
    started: datetime,
    duration_s: float,
    placed: int,
    pending: int,
) -> None:
    await conn.execute(
        "INSERT INTO placer_cycles VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        epoch,
        cycle,
        started,
        duration_s,
        placed,
        pending,
    )


async def load_priorities(conn: Conn) -> dict[int, float]:
    """Multifactor priority of pending jobs, as the fairshare service last computed it."""
    rows = await conn.fetch("SELECT job_id, total FROM job_priorities")
    return {r["job_id"]: float(r["total"]) for r in rows}


async def record_preemption(conn: Conn, victim_job_id: int, for_job_id: int, epoch: int) -> bool:
    """Note that the victim's live allocation is being preempted; False when it was
    already asked (the launcher is giving it its grace time)."""
    row = await conn.fetchval(
        "INSERT INTO preemptions(victim_alloc_id, victim_job_id, for_job_id, epoch)"
        " SELECT alloc_id, job_id, $2, $3 FROM allocations"
        " WHERE job_id = $1 AND released_at IS NULL"
        " ON CONFLICT DO NOTHING RETURNING true",
        victim_job_id,
        for_job_id,
        epoch,
    )
    return bool(row)


class LiveAllocation(msgspec.Struct, frozen=True, kw_only=True):
    alloc_id: int
    attempt: int
    nodes: tuple[str, ...]
    spec: JobSpec


async def live_allocation(conn: Conn, job_id: int) -> LiveAllocation | None:
    row = await conn.fetchrow(
        "SELECT a.alloc_id, a.attempt, j.spec,"
        " array(SELECT n.node FROM allocation_nodes n WHERE n.alloc_id = a.alloc_id AND n.live"
        "   ORDER BY n.rank) AS nodes"
        " FROM allocations a JOIN jobs j USING (job_id)"
        " WHERE a.job_id = $1 AND a.released_at IS NULL",
        job_id,
    )
    if row is None:
        return None
    return LiveAllocation(
        alloc_id=row["alloc_id"],
        attempt=row["attempt"],
        nodes=tuple(row["nodes"]),
        spec=msgspec.json.decode(row["spec"], type=JobSpec),
    )


async def swap_nodes(
    conn: Conn, alloc_id: int, drop: tuple[str, ...], add: tuple[Grant, ...]
) -> None:
    """Replace lost nodes of a live allocation with spares; the unique index on live
    GPUs still refuses any GPU held twice."""
    await conn.execute(
        "UPDATE allocation_nodes SET live = false WHERE alloc_id = $1 AND node = ANY($2::text[])",
        alloc_id,
        list(drop),
    )
    await conn.execute(
        "UPDATE allocation_gpus SET live = false WHERE alloc_id = $1 AND node = ANY($2::text[])",
        alloc_id,
        list(drop),
    )
    top = await conn.fetchval(
        "SELECT coalesce(max(rank), -1) FROM allocation_nodes WHERE alloc_id = $1", alloc_id
    )
    await conn.executemany(
        "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus, spare_pending)"
        " VALUES ($1, $2, $3, $4, true) ON CONFLICT (alloc_id, node) DO UPDATE SET"
        " live = true, rank = excluded.rank, gpus = excluded.gpus, spare_pending = true,"
        " added_at = now()",
        [(alloc_id, g.node, top + 1 + i, list(g.gpus)) for i, g in enumerate(add)],
    )
    await conn.executemany(
        "INSERT INTO allocation_gpus(alloc_id, node, gpu) VALUES ($1, $2, $3)"
        " ON CONFLICT (alloc_id, node, gpu) DO UPDATE SET live = true",
        [(alloc_id, g.node, gpu) for g in add for gpu in g.gpus],
    )
