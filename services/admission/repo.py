"""Admission SQL: admission owns `jobs`; it reads the other tables to answer queries.
Functions run inside the caller's transaction (reads may run outside one)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import asyncpg
import msgspec

from services.admission.config_model import ClusterConfig
from shared.db import Conn, hold_job_changes
from shared.jobspec import JobSpec
from shared.states import TERMINAL, JobState
from shared.usage_sql import used_by_attempt

from .policy import NO_POLICY, JobPolicy
from .values import resolve_tasks


async def insert_job(conn: Conn, spec: JobSpec, policy: JobPolicy = NO_POLICY) -> int:
    job_id: int = await conn.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec, held, array_job_id, array_task_id,"
        " tier, preemptible, can_preempt, grace_s, min_runtime_s, needs_approval)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13,"
        " $14, $15, $16, $17, $18, $19) RETURNING job_id",
        spec.name,
        spec.user,
        spec.account,
        spec.partition,
        spec.qos,
        spec.nodes_min,
        spec.nodes_max,
        spec.gpus_per_node,
        spec.time_limit_s,
        msgspec.json.encode(spec).decode(),
        spec.hold,
        spec.array_job_id,
        spec.array_task_id,
        policy.tier,
        policy.preemptible,
        policy.can_preempt,
        policy.grace_s,
        policy.min_runtime_s,
        policy.needs_approval,
    )
    return job_id


# a run in any other state has ended for good
UNFINISHED_RUNS = sorted(str(s) for s in JobState if s not in TERMINAL)


async def submit_counts(
    conn: Conn, user: str, account: str, qos: str, besides: int | None = None
) -> tuple[int, int]:
    """Unfinished jobs under `qos` of `user` and of `account` (but job `besides`, one
    being moved), serialised per QOS so two concurrent submissions cannot both slip
    under a limit. Unfinished: waiting (no run, or a requeued one: `waiting_jobs`) or
    with a run in a live state, both read by index: a user's finished jobs, which only
    grow, are never read."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('admission.qos.' || $1))", qos)
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE j.user_name = $1) AS u,"
        " count(*) FILTER (WHERE j.account = $2) AS a"
        " FROM jobs j WHERE j.job_id IN (SELECT job_id FROM waiting_jobs"
        "   UNION SELECT job_id FROM job_runs WHERE state = ANY($4::text[]))"
        " AND j.qos = $3 AND (j.user_name = $1 OR j.account = $2)"
        " AND j.cancel_requested_at IS NULL AND j.job_id IS DISTINCT FROM $5",
        user,
        account,
        qos,
        UNFINISHED_RUNS,
        besides,
    )
    assert row is not None
    return int(row["u"]), int(row["a"])


async def absent_jobs(conn: Conn, job_ids: Iterable[int]) -> set[int]:
    """Those of `job_ids` the database does not hold (never submitted, or purged)."""
    wanted = set(job_ids)
    if not wanted:
        return set()
    rows = await conn.fetch(
        "SELECT job_id FROM jobs WHERE job_id = ANY($1::bigint[])", sorted(wanted)
    )
    return wanted - {r["job_id"] for r in rows}


async def with_task_jobs(conn: Conn, spec: JobSpec) -> tuple[JobSpec, list[str]]:
    """The spec with the array tasks its dependencies name (`afterok:12_3`) replaced by
    the tasks' own job ids; and those the database does not hold, as written."""
    refs = sorted(spec.task_refs)
    if not refs:
        return spec, []
    rows = await conn.fetch(
        "SELECT j.job_id, j.array_job_id, j.array_task_id FROM jobs j"
        " JOIN unnest($1::bigint[], $2::int[]) AS x(a, t)"
        "   ON j.array_job_id = x.a AND j.array_task_id = x.t",
        [a for a, _ in refs],
        [t for _, t in refs],
    )
    found = {(r["array_job_id"], r["array_task_id"]): r["job_id"] for r in rows}
    terms, missing = resolve_tasks(spec.dependencies, found)
    return msgspec.structs.replace(spec, dependencies=terms), missing


async def set_array_job(conn: Conn, job_id: int, spec: JobSpec) -> None:
    await conn.execute(
        "UPDATE jobs SET array_job_id = $2, spec = $3::jsonb WHERE job_id = $1",
        job_id,
        spec.array_job_id,
        msgspec.json.encode(spec).decode(),
    )


async def node_shapes(conn: Conn) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT n.name, n.state, n.features, n.cpus, n.memory_mib, count(g.idx) AS gpus,"
        " min(g.model) AS model"
        " FROM nodes n LEFT JOIN gpus g ON g.node = n.name GROUP BY n.name ORDER BY n.name"
    )


async def owners(conn: Conn, job_ids: list[int]) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT job_id, user_name, cancel_requested_at IS NOT NULL AS cancelled"
        " FROM jobs WHERE job_id = ANY($1::bigint[]) FOR UPDATE",
        job_ids,
    )


async def select_jobs(conn: Conn, name: str | None, owner: str | None) -> list[int]:
    rows = await conn.fetch(
        "SELECT j.job_id FROM jobs j LEFT JOIN job_runs r USING (job_id)"
        " WHERE ($1::text IS NULL OR j.name = $1) AND ($2::text IS NULL OR j.user_name = $2)"
        " AND j.cancel_requested_at IS NULL"
        " AND (r.state IS NULL OR NOT r.state = ANY($3::text[]))",
        name,
        owner,
        TERMINAL,
    )
    return [r["job_id"] for r in rows]


async def request_cancel(conn: Conn, job_id: int, reason: str) -> None:
    await conn.execute(
        "UPDATE jobs SET cancel_requested_at = now(), cancel_reason = $2"
        " WHERE job_id = $1 AND cancel_requested_at IS NULL",
        job_id,
        reason,
    )


async def set_held(
    conn: Conn, job_ids: list[int], held: bool, reason: str, by_operator: bool = False
) -> None:
    await conn.execute(
        "UPDATE jobs SET held = $2, hold_reason = $3, held_by_operator = $4"
        " WHERE job_id = ANY($1::bigint[])",
        job_ids,
        held,
        reason if held else None,
        by_operator and held,
    )


async def approve(conn: Conn, job_ids: list[int], by: str) -> None:
    await conn.execute(
        "UPDATE jobs SET approved_by = $2, approved_at = now()"
        " WHERE job_id = ANY($1::bigint[]) AND needs_approval AND approved_at IS NULL",
        job_ids,
        by,
    )


JOB_VIEW = """
SELECT j.job_id, j.name, j.user_name, j.account, j.partition, j.qos, j.nodes_max,
       j.gpus_per_node, j.time_limit_s, j.held, j.array_job_id, j.array_task_id,
       CASE WHEN j.array_job_id IS NOT NULL
            THEN (j.spec->>'array_max_running')::int END AS array_throttle,
       j.held_by_operator, j.hold_reason, j.needs_approval, j.approved_by,
       j.approved_at IS NOT NULL AS approved,
       extract(epoch FROM j.submitted_at)::float8 AS submitted,
       j.cancel_requested_at, j.cancel_reason,
       r.state AS run_state, r.reason AS run_reason, r.nodes AS run_nodes, r.exit_code,
       r.restart_count, extract(epoch FROM r.started_at)::float8 AS started,
       extract(epoch FROM r.ended_at)::float8 AS ended,
       extract(epoch FROM r.updated_at)::float8 AS run_updated,
       p.reason AS wait_reason, p.detail AS wait_detail,
       extract(epoch FROM p.estimated_start)::float8 AS est,
       (SELECT array_agg(n.node ORDER BY n.rank) FROM allocations a
          JOIN allocation_nodes n ON n.alloc_id = a.alloc_id AND n.live
         WHERE a.job_id = j.job_id AND a.released_at IS NULL) AS alloc_nodes
       ,(SELECT count(*) FROM allocations a
          JOIN allocation_gpus g ON g.alloc_id = a.alloc_id AND g.live
         WHERE a.job_id = j.job_id AND a.released_at IS NULL) AS alloc_gpus
       ,(SELECT pr.for_job_id FROM preemptions pr
          JOIN allocations a ON a.alloc_id = pr.victim_alloc_id AND a.released_at IS NULL
         WHERE pr.victim_job_id = j.job_id LIMIT 1) AS preempted_for
  FROM jobs j
  LEFT JOIN job_runs r USING (job_id)
  LEFT JOIN pending_reasons p USING (job_id)
"""


class Where:
    """A WHERE clause built from optional filters, with numbered arguments."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.args: list[object] = []

    def arg(self, value: object) -> str:
        self.args.append(value)
        return f"${len(self.args)}"

    def add(self, sql: str) -> None:
        self.parts.append(sql)

    def sql(self) -> str:
        return (" WHERE " + " AND ".join(self.parts)) if self.parts else ""


def refs_clause(where: Where, refs: list[tuple[int, tuple[int, ...] | None]]) -> None:
    """Jobs named by (job id, array tasks or None): a plain id is that job or every
    task of the array it heads."""
    plain = [job_id for job_id, tasks in refs if tasks is None]
    ors = []
    if plain:
        ids = where.arg(plain)
        ors.append(f"j.job_id = ANY({ids}::bigint[]) OR j.array_job_id = ANY({ids}::bigint[])")
    for job_id, tasks in refs:
        if tasks is not None:
            ors.append(
                f"(j.array_job_id = {where.arg(job_id)}"
                f" AND j.array_task_id = ANY({where.arg(list(tasks))}::int[]))"
            )
    where.add("(" + " OR ".join(ors) + ")")


async def job_rows(
    conn: Conn, job_ids: list[int] | None, users: list[str] | None
) -> list[asyncpg.Record]:
    where = Where()
    if job_ids:
        where.add(f"j.job_id = ANY({where.arg(job_ids)}::bigint[])")
    if users:
        where.add(f"j.user_name = ANY({where.arg(users)}::text[])")
    return await select_rows(conn, where)


async def update_jobs(conn: Conn, job_ids: list[int], fields: dict[str, object]) -> None:
    """Change these jobs' spec fields in place, and the column that copies one (`name`);
    the spec's other fields, and the job's place, stay (the limit: `update_limits`)."""
    if not job_ids or not fields:
        return
    await conn.execute(
        "UPDATE jobs SET spec = spec || $2::jsonb, name = coalesce($3, name)"
        " WHERE job_id = ANY($1::bigint[])",
        job_ids,
        json.dumps(fields),
        fields.get("name"),
    )


async def update_limits(conn: Conn, limits: Sequence[tuple[int, int]]) -> None:
    """Set each job's new time limit, in its spec and the column that copies it."""
    if not limits:
        return
    await conn.execute(
        "UPDATE jobs j SET time_limit_s = x.limit_s,"
        " spec = j.spec || jsonb_build_object('time_limit_s', x.limit_s)"
        " FROM unnest($1::bigint[], $2::int[]) AS x(job_id, limit_s) WHERE j.job_id = x.job_id",
        [j for j, _ in limits],
        [s for _, s in limits],
    )


async def replace_spec(conn: Conn, job_id: int, spec: JobSpec, policy: JobPolicy) -> None:
    """A pending job's new spec after a change of its placement fields (replan.py):
    the columns that copy it, its policy's, and one more change counted for the placer
    (`spec_version`, migration 0031). Its id, submit time and holds stay."""
    await conn.execute(
        "UPDATE jobs SET spec = $2::jsonb, name = $3, partition = $4, qos = $5,"
        " nodes_min = $6, nodes_max = $7, gpus_per_node = $8, time_limit_s = $9,"
        " tier = $10, preemptible = $11, can_preempt = $12, grace_s = $13,"
        " min_runtime_s = $14, needs_approval = $15, account = $16,"
        " spec_version = spec_version + 1 WHERE job_id = $1",
        job_id, msgspec.json.encode(spec).decode(), spec.name, spec.partition, spec.qos,
        spec.nodes_min, spec.nodes_max, spec.gpus_per_node, spec.time_limit_s, policy.tier,
        policy.preemptible, policy.can_preempt, policy.grace_s, policy.min_runtime_s,
        policy.needs_approval, spec.account,
    )  # fmt: skip


async def job_specs(conn: Conn, job_ids: Sequence[int]) -> dict[int, JobSpec]:
    rows = await conn.fetch(
        "SELECT job_id, spec FROM jobs WHERE job_id = ANY($1::bigint[])", list(job_ids)
    )
    return {r["job_id"]: msgspec.json.decode(r["spec"], type=JobSpec) for r in rows}


async def lock_rows(conn: Conn, where: Where) -> None:
    """Hold the selected jobs' rows, then their change locks, reading nothing else: a
    read after this one (a new statement) sees what committed while it waited (an
    allocation's insert holds its job's row until the placer's cycle commits), and a
    placer that planned a preemption for one of them by its old fields, committing
    after this transaction, reads its change (`hold_job_changes`)."""
    rows = await conn.fetch(
        "SELECT j.job_id FROM jobs j" + where.sql() + " FOR UPDATE OF j", *where.args
    )
    await hold_job_changes(conn, (r["job_id"] for r in rows), shared=False)


async def select_rows(conn: Conn, where: Where, *, lock: bool = False) -> list[asyncpg.Record]:
    sql = JOB_VIEW + where.sql() + " ORDER BY j.job_id" + (" FOR UPDATE OF j" if lock else "")
    return await conn.fetch(sql, *where.args)


async def job_spec(conn: Conn, job_id: int) -> dict[str, object] | None:
    raw = await conn.fetchval("SELECT spec FROM jobs WHERE job_id = $1", job_id)
    return None if raw is None else dict(json.loads(raw))


async def attempts(conn: Conn, job_id: int) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT attempt, seq, nodes, world_size, reason, outcome,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM ended_at)::float8 AS ended"
        " FROM attempts WHERE job_id = $1 ORDER BY attempt, seq",
        job_id,
    )


async def used(conn: Conn, job_id: int) -> asyncpg.Record | None:
    """What the job's current attempt used (shared.usage_sql: sacct's MaxRSS,
    MaxRSSNode, TotalCPU; NULLs before any worker exited); None: the job never ran."""
    return await conn.fetchrow(
        "SELECT u.* FROM job_runs r,"
        f" LATERAL ({used_by_attempt('r.job_id', 'r.attempt')}) u WHERE r.job_id = $1",
        job_id,
    )


async def steps(conn: Conn, job_id: int) -> list[asyncpg.Record]:
    """The job's srun steps (the launcher's `job_steps`), oldest first."""
    return await conn.fetch(
        "SELECT step_id, argv, nodes, ntasks, state, exit_code, gpus::text AS gpus,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM ended_at)::float8 AS ended"
        " FROM job_steps WHERE job_id = $1 ORDER BY step_id",
        job_id,
    )


async def running_steps(conn: Conn, job_ids: list[int]) -> list[asyncpg.Record]:
    """These jobs' RUNNING srun steps, by job and step (`squeue -s`)."""
    return await conn.fetch(
        "SELECT job_id, step_id, argv, nodes, ntasks, state, exit_code, gpus::text AS gpus,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM ended_at)::float8 AS ended"
        " FROM job_steps WHERE job_id = ANY($1::bigint[]) AND state = 'RUNNING'"
        " ORDER BY job_id, step_id",
        job_ids,
    )


async def nodes_view(conn: Conn) -> tuple[list[asyncpg.Record], list[asyncpg.Record]]:
    nodes = await conn.fetch(
        "SELECT name, state, reason, topology, extract(epoch FROM last_heartbeat)::float8 AS hb,"
        " last_fault, n.features || coalesce(p.features, '{}') AS features, p.gpu_type,"
        " n.cpus, n.memory_mib, extract(epoch FROM n.state_since)::float8 AS since,"
        # the CPUs the jobs holding it asked of it (sinfo's %C, scontrol's CPUAlloc=)
        " (SELECT coalesce(sum(coalesce((j.spec->>'cpus_per_task')::int, 1)"
        "    * coalesce((j.spec->>'ntasks_per_node')::int, 1)), 0)::int"
        "    FROM allocation_nodes an"
        "    JOIN allocations a ON a.alloc_id = an.alloc_id AND a.released_at IS NULL"
        "    JOIN jobs j ON j.job_id = a.job_id WHERE an.node = n.name AND an.live) AS cpus_alloc,"
        # and the memory they hold of it (scontrol's AllocMem=): --mem=0, all of it
        " (SELECT coalesce(sum(CASE (j.spec->>'mem_mib')::bigint WHEN 0 THEN n.memory_mib"
        "    ELSE (j.spec->>'mem_mib')::bigint END), 0)::bigint"
        "    FROM allocation_nodes an"
        "    JOIN allocations a ON a.alloc_id = an.alloc_id AND a.released_at IS NULL"
        "    JOIN jobs j ON j.job_id = a.job_id WHERE an.node = n.name AND an.live) AS mem_alloc"
        " FROM nodes n LEFT JOIN node_policy p ON p.node = n.name ORDER BY name"
    )
    gpus = await conn.fetch(
        "SELECT g.node, g.idx, g.model, g.healthy, g.last_xid, a.job_id FROM gpus g"
        " LEFT JOIN allocation_gpus ag ON ag.node = g.node AND ag.gpu = g.idx AND ag.live"
        " LEFT JOIN allocations a ON a.alloc_id = ag.alloc_id ORDER BY g.node, g.idx"
    )
    return nodes, gpus


async def publish_policy(conn: Conn, config: ClusterConfig | None) -> None:
    """Write the placement policy of `config` for the placer: partitions' nodes and
    tiers, the running limits of each QOS, and reservations. No config: no rows.

    Replicas publish at once when they start (or reload one file): without the lock
    both delete, both insert, and one dies on the primary key. Serialised, the later
    one replaces the earlier's rows with the same ones."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('muster.admission.policy'))")
    await conn.execute("DELETE FROM partition_policy")
    await conn.execute("DELETE FROM qos_limits")
    await conn.execute("DELETE FROM reservations")
    await conn.execute("DELETE FROM node_policy")
    if config is None:
        return
    await conn.executemany(
        "INSERT INTO node_policy(node, features, gpu_type) VALUES ($1, $2, $3)",
        [(n, list(t.features), t.gpu_type) for n, t in config.node_traits.items()],
    )
    await conn.executemany(
        "INSERT INTO reservations(name, start_at, duration_s, nodes, gpus, accounts,"
        " recurrence, maintenance) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        [
            (
                w.name,
                w.start,
                w.duration_s,
                list(w.nodes),
                w.gpus,
                list(w.accounts),
                w.recurrence,
                w.maintenance,
            )
            for w in config.reservations.values()
        ],
    )
    await conn.executemany(
        "INSERT INTO partition_policy(partition, nodes, tier, reserved_gpus)"
        " VALUES ($1, $2, $3, $4)",
        [
            (
                name,
                None if p.node_names is None else list(p.node_names),
                p.priority_tier,
                p.reserved_gpus,
            )
            for name, p in config.partitions.items()
        ],
    )
    await conn.executemany(
        "INSERT INTO qos_limits(qos, max_gpus_per_user, max_jobs_per_user,"
        " max_gpus_per_account, max_jobs_per_account) VALUES ($1, $2, $3, $4, $5)",
        [
            (
                name,
                q.max_gpus_per_user,
                q.max_running_jobs_per_user,
                q.max_gpus_per_account,
                q.max_running_jobs_per_account,
            )
            for name, q in config.qos.items()
        ],
    )


async def predicted_end(conn: Conn, job_id: int) -> tuple[float | None, str]:
    """The placer's predicted end of the job's live allocation, and why (placer's)."""
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM predicted_end)::float8 AS at, predicted_why FROM allocations"
        " WHERE job_id = $1 AND released_at IS NULL",
        job_id,
    )
    if row is None or row["at"] is None:
        return None, ""
    return float(row["at"]), str(row["predicted_why"])


async def job_priority(conn: Conn, job_id: int) -> dict[str, float]:
    """The job's multifactor priority and its weighted parts, as fairshare last ranked
    it (pending jobs only; empty once it runs)."""
    return (await job_priorities(conn, [job_id])).get(job_id, {})


async def job_priorities(conn: Conn, job_ids: list[int]) -> dict[int, dict[str, float]]:
    """`job_priority` of each of these jobs that has one."""
    rows = await conn.fetch(
        "SELECT job_id, factors FROM job_priorities WHERE job_id = ANY($1::bigint[])", job_ids
    )
    return {r["job_id"]: _numbers(json.loads(r["factors"])) for r in rows}


def _numbers(parts: dict[str, object]) -> dict[str, float]:
    return {k: float(v) for k, v in parts.items() if isinstance(v, int | float)}
