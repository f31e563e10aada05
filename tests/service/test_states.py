"""The schema's CHECK constraints and `shared/states.py` name the same states, on real
PostgreSQL: every state a column may hold is accepted, every other one (a typo, a state
that is only ever derived) is refused at the write."""

from __future__ import annotations

import asyncpg

from shared.states import RUN_STATES, STOPPING_TO, GpuTime, JobState, NodeState

TYPOS = ("RUNING", "running", "", "CANCELED")


async def _job(db: asyncpg.Connection) -> int:
    job_id: int = await db.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec) VALUES ('train', 'alice', 'ml', 'gpu', 'normal',"
        " 1, 1, 8, 3600, '{}') RETURNING job_id"
    )
    return job_id


async def _accepted(db: asyncpg.Connection, sql: str, *args: object) -> bool:
    """Whether the write passes the constraints; rolled back either way."""
    tx = db.transaction()
    await tx.start()
    try:
        await db.execute(sql, *args)
    except asyncpg.CheckViolationError:
        return False
    finally:
        await tx.rollback()
    return True


async def test_nodes_take_every_node_state_and_refuse_anything_else(db: asyncpg.Connection) -> None:
    await db.execute("INSERT INTO nodes(name) VALUES ('node01')")
    sql = "UPDATE nodes SET state = $1 WHERE name = 'node01'"
    accepted = {s: await _accepted(db, sql, s) for s in (*NodeState, *TYPOS, "IDLE")}
    assert accepted == {s: s in set(NodeState) for s in accepted}


async def test_job_runs_take_every_run_state_and_refuse_derived_states_and_typos(
    db: asyncpg.Connection,
) -> None:
    job_id = await _job(db)
    sql = "INSERT INTO job_runs(job_id, state) VALUES ($1, $2)"
    accepted = {s: await _accepted(db, sql, job_id, s) for s in (*JobState, *TYPOS)}
    assert accepted == {s: s in RUN_STATES for s in accepted}
    assert not accepted[JobState.PENDING] and not accepted[JobState.CONFIGURING]


async def test_a_completing_run_ends_only_in_a_terminal_state_or_the_queue(
    db: asyncpg.Connection,
) -> None:
    job_id = await _job(db)
    sql = "INSERT INTO job_runs(job_id, state, stopping_to) VALUES ($1, 'COMPLETING', $2)"
    candidates: tuple[str | None, ...] = (None, *JobState, *TYPOS)
    accepted = {s: await _accepted(db, sql, job_id, s) for s in candidates}
    assert accepted == {s: s is None or s in STOPPING_TO for s in accepted}


async def test_cluster_hours_take_every_gpu_time_state_and_nothing_else(
    db: asyncpg.Connection,
) -> None:
    sql = "INSERT INTO cluster_hours(hour, state) VALUES (now(), $1)"
    accepted = {s: await _accepted(db, sql, s) for s in (*GpuTime, *TYPOS, "BUSY")}
    assert accepted == {s: s in set(GpuTime) for s in accepted}
