"""Launcher repository: the `job_steps` rows (docs/steps.md), with their coordinators.

A RUNNING step has one coordinator at a time: the replica whose name is in
`coordinator` while `lease_until` (the database's clock) is ahead. It renews the lease
while it waits on the agents; every write of the step's end names it, so a replica that
lost the lease (killed, paused, partitioned) writes nothing. A step whose lease ran out
is claimed by another replica (`claim_orphans`, SKIP LOCKED: one claimer per step).
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.launcher.steps_core import Layout, StepState
from shared.api import StepRequest
from shared.db import Conn
from shared.jobspec import JobSpec

# Seconds until a job's time limit as it stands (`jobs j`, its run `job_runs r`).
REMAINING = "j.time_limit_s - coalesce(extract(epoch FROM now() - r.started_at), 0)"
# What a coordinator (a fresh one or an adopting one) needs of a step and its job.
STEP_COLUMNS = (
    "s.job_id, s.step_id, s.attempt, s.generation, s.argv, s.nodes, s.ntasks, s.state,"
    " s.exit_code, s.signal, s.message, j.user_name, s.output_dir, s.kill_on_bad_exit,"
    f" {REMAINING} AS remaining_s"
)
STEP_FROM = (
    " FROM job_steps s JOIN jobs j USING (job_id) LEFT JOIN job_runs r ON r.job_id = s.job_id"
)


async def live_run(conn: Conn, job_id: int) -> tuple[Any, JobSpec] | None:
    """The job's run and spec while it runs, or while it starts (its `state` says
    which: a STARTING run's workers are not yet started on every node)."""
    row = await conn.fetchrow(
        "SELECT r.state, r.attempt, r.restart_count, r.nodes, r.gpus::text AS gpus,"
        " j.spec::text AS spec, extract(epoch FROM now() - r.started_at) AS run_s"
        " FROM job_runs r JOIN jobs j USING (job_id)"
        " WHERE r.job_id = $1 AND r.state IN ('RUNNING', 'STARTING')",
        job_id,
    )
    if row is None:
        return None
    return row, msgspec.json.decode(row["spec"], type=JobSpec)


async def time_left(conn: Conn, job_id: int) -> float | None:
    """Seconds until the job's time limit as it stands now (`muster update` may have
    changed it since a step started); None once its run is no longer live."""
    left = await conn.fetchval(
        f"SELECT {REMAINING} FROM jobs j JOIN job_runs r USING (job_id)"
        " WHERE j.job_id = $1 AND r.state IN ('RUNNING', 'STARTING')",
        job_id,
    )
    return None if left is None else float(left)


async def step_by_folder(conn: Conn, job_id: int, output_dir: str) -> Any:
    """The step srun started with this output folder (its own), or None."""
    return await conn.fetchrow(
        f"SELECT {STEP_COLUMNS}{STEP_FROM} WHERE s.job_id = $1 AND s.output_dir = $2",
        job_id,
        output_dir,
    )


async def step_row(conn: Conn, job_id: int, step_id: int) -> Any:
    return await conn.fetchrow(
        f"SELECT {STEP_COLUMNS}{STEP_FROM} WHERE s.job_id = $1 AND s.step_id = $2",
        job_id,
        step_id,
    )


async def lock_job(conn: Conn, job_id: int) -> None:
    """The job's run row locked to the end of the transaction: one step is laid out
    and numbered at a time."""
    await conn.execute("SELECT 1 FROM job_runs WHERE job_id = $1 FOR UPDATE", job_id)


async def held_gpus(conn: Conn, job_id: int, attempt: int, generation: int) -> dict[str, set[int]]:
    """The GPUs the job's RUNNING steps (of this start) hold alone, by node."""
    rows = await conn.fetch(
        "SELECT gpus::text FROM job_steps WHERE job_id = $1 AND state = 'RUNNING'"
        " AND attempt = $2 AND generation = $3 AND gpus <> '{}'::jsonb",
        job_id,
        attempt,
        generation,
    )
    held: dict[str, set[int]] = {}
    for row in rows:
        for node, gpus in msgspec.json.decode(row["gpus"], type=dict[str, list[int]]).items():
            held.setdefault(node, set()).update(gpus)
    return held


async def insert_step(
    conn: Conn, req: StepRequest, attempt: int, generation: int, lay: Layout,
    holder: str, lease_s: float,
) -> int:  # fmt: skip
    """The job's next step id (0, 1, ...), coordinated by `holder` for `lease_s` from
    now; inside the caller's transaction, under `lock_job`. Its start is the insert's
    own clock, not the transaction's: after the end of any step whose GPUs it took."""
    step_id = await conn.fetchval(
        "INSERT INTO job_steps(job_id, step_id, attempt, generation, argv, nodes, ntasks,"
        " state, output_dir, coordinator, lease_until, gpus, kill_on_bad_exit, started_at)"
        " SELECT $1, coalesce(max(step_id) + 1, 0), $2, $3, $4, $5, $6, $7, $8, $9,"
        " now() + make_interval(secs => $10), $11::jsonb, $12, clock_timestamp()"
        " FROM job_steps WHERE job_id = $1 RETURNING step_id",
        req.job_id,
        attempt,
        generation,
        list(req.argv),
        list(lay.nodes),
        len(lay.tasks),
        str(StepState.RUNNING),
        req.output_dir,
        holder,
        lease_s,
        msgspec.json.encode(lay.held()).decode(),
        req.kill_on_bad_exit,
    )
    return int(step_id)


async def renew(conn: Conn, job_id: int, step_id: int, holder: str, lease_s: float) -> bool:
    """Extend `holder`'s lease on a RUNNING step; False: it is not (or no longer) its."""
    done = await conn.fetchval(
        "UPDATE job_steps SET lease_until = now() + make_interval(secs => $4)"
        " WHERE job_id = $1 AND step_id = $2 AND coordinator = $3 AND state = 'RUNNING'"
        " RETURNING true",
        job_id,
        step_id,
        holder,
        lease_s,
    )
    return bool(done)


async def claim_orphans(conn: Conn, holder: str, lease_s: float, limit: int = 20) -> list[Any]:
    """RUNNING steps whose coordinator's lease ran out (or that never had one), now
    `holder`'s: their rows, as `step_row` gives them."""
    claimed = await conn.fetch(
        "UPDATE job_steps s SET coordinator = $1, lease_until = now() + make_interval(secs => $2)"
        " FROM (SELECT job_id, step_id FROM job_steps WHERE state = 'RUNNING'"
        "       AND (lease_until IS NULL OR lease_until < now())"
        "       ORDER BY job_id, step_id LIMIT $3 FOR UPDATE SKIP LOCKED) o"
        " WHERE s.job_id = o.job_id AND s.step_id = o.step_id RETURNING s.job_id, s.step_id",
        holder,
        lease_s,
        limit,
    )
    rows = []
    for c in claimed:
        row = await step_row(conn, c["job_id"], c["step_id"])
        if row is not None:
            rows.append(row)
    return rows


async def end_step(
    conn: Conn, job_id: int, step_id: int, holder: str, state: StepState,
    exit_code: int | None, sig: int | None, message: str,
) -> bool:  # fmt: skip
    """Record how the step ended, if `holder` still coordinates it."""
    done = await conn.fetchval(
        "UPDATE job_steps SET state = $4, exit_code = $5, signal = $6, message = $7,"
        " ended_at = now(), lease_until = NULL"
        " WHERE job_id = $1 AND step_id = $2 AND coordinator = $3 AND state = 'RUNNING'"
        " RETURNING true",
        job_id,
        step_id,
        holder,
        str(state),
        exit_code,
        sig,
        message,
    )
    return bool(done)
