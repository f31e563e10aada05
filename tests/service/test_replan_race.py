"""A pending job's placement changed while the placer places it, on real PostgreSQL
(migration 0031, services/placer/service.py `_apply`, services/admission/commands.py
`update`): whichever commits first, the other sees it.

- The placer's allocation insert takes a key-share lock on the job's row (the foreign
  key); admission's update selects the row FOR UPDATE, so it waits for the placer's
  commit and then reads the job allocated: it is no longer pending, and is skipped.
- Admission's update, holding the row, makes the insert wait; the placer then reads
  the job's change count moved and withdraws the start (no `job.allocated`).
- A preemption for the job writes nothing on its row: the update's exclusive change
  lock makes the placer's shared one wait, and the placer then reads the change and
  does not ask it (no `preemptions` row, no `job.preempt_requested`). A preemption in
  flight first makes the update wait for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

import asyncpg
import pytest

from services.admission import repo as admission
from services.admission.repo import insert_job
from services.placer.core import Grant, Plan, Preempt, Start
from services.placer.repo import acquire_lease
from services.placer.service import _apply
from shared.jobspec import JobSpec

SPEC = JobSpec(
    user="alice", account="a", partition="normal", script="#!/bin/bash\ntrue\n",
    nodes_min=1, nodes_max=1, gpus_per_node=1, time_limit_s=600,
)  # fmt: skip
WAIT_S = 0.5  # long enough for a statement that does not wait to have answered


def start(job_id: int) -> Plan:
    return Plan(starts=(Start(job_id=job_id, grants=(Grant(node="n1", gpus=(0,)),)),))


def preempt(victim: int, for_job: int) -> Plan:
    return Plan(preemptions=(Preempt(victim_job_id=victim, for_job_id=for_job, grace_s=30),))


async def written(
    db: asyncpg.Connection, table: str, column: str, subject: str, job_id: int
) -> tuple[int, int]:
    """(rows of `table` whose `column` is the job, `subject` events about the job)."""
    rows = await db.fetchval(f"SELECT count(*) FROM {table} WHERE {column} = $1", job_id)
    events = await db.fetchval(
        "SELECT count(*) FROM outbox WHERE subject = $1"
        " AND convert_from(payload, 'UTF8')::jsonb->>'job_id' = $2::text",
        subject,
        str(job_id),
    )
    return rows, events


async def preempted(db: asyncpg.Connection, victim: int) -> tuple[int, int]:
    """(preemptions recorded, job.preempt_requested events) of the victim."""
    return await written(db, "preemptions", "victim_job_id", "muster.job.preempt_requested", victim)


async def allocated(db: asyncpg.Connection, job_id: int) -> tuple[int, int]:
    """(allocations, job.allocated events) of the job."""
    return await written(db, "allocations", "job_id", "muster.job.allocated", job_id)


def selected(job_id: int) -> admission.Where:
    where = admission.Where()
    where.add(f"j.job_id = {where.arg(job_id)}")
    return where


async def lock(conn: asyncpg.Connection, job_id: int) -> None:
    """Admission's hold on the jobs to update (`update`'s first statement)."""
    await admission.lock_rows(conn, selected(job_id))


async def rows_of(conn: asyncpg.Connection, job_id: int) -> list[asyncpg.Record]:
    """Admission's read of the jobs it holds (`update`'s next)."""
    return await admission.select_rows(conn, selected(job_id), lock=True)


async def test_a_start_planned_by_old_fields_is_withdrawn(db: asyncpg.Connection) -> None:
    epoch = await acquire_lease(db, "test", 60.0)
    assert epoch is not None
    job = await insert_job(db, SPEC)
    await db.execute("UPDATE jobs SET spec_version = 1 WHERE job_id = $1", job)
    async with db.transaction():
        await _apply(db, start(job), {job: 1}, {job: 0}, epoch)  # read before the change
    assert await allocated(db, job) == (0, 0)
    assert await db.fetchval("SELECT count(*) FROM allocation_gpus") == 0
    async with db.transaction():
        await _apply(db, start(job), {job: 1}, {job: 1}, epoch)  # the next cycle's read
    assert await allocated(db, job) == (1, 1)


class Sides(NamedTuple):
    """One job and an epoch to place it under, with a connection for each side."""

    job: int
    epoch: int
    placer: asyncpg.Connection
    update: asyncpg.Connection


@pytest.fixture
async def sides(db: asyncpg.Connection, database_url: str) -> AsyncIterator[Sides]:
    epoch = await acquire_lease(db, "test", 60.0)
    assert epoch is not None
    job = await insert_job(db, SPEC)
    placer = await asyncpg.connect(database_url)
    update = await asyncpg.connect(database_url)
    try:
        yield Sides(job, epoch, placer, update)
    finally:
        await placer.close()
        await update.close()


async def update_behind(sides: Sides, plan: Plan, what: str) -> list[asyncpg.Record]:
    """The placer writes `plan` (planned before any change) and has not committed; the
    update must wait for it. What the update reads once it holds the job."""
    job, epoch, placer, update = sides
    tx = placer.transaction()
    await tx.start()
    await _apply(placer, plan, {job: 1}, {job: 0}, epoch)  # not yet committed
    async with update.transaction():
        held = asyncio.ensure_future(lock(update, job))
        done, _ = await asyncio.wait({held}, timeout=WAIT_S)
        assert not done, f"the update did not wait for the {what} in flight"
        await tx.commit()
        await held  # the lock, once the placer committed
        return await rows_of(update, job)  # the read after the hold, as `update`'s


async def placer_behind(sides: Sides, plan: Plan, what: str) -> None:
    """An update holds the job and has changed it, not committed; the placer's `plan`
    (planned by the old fields) must wait for it, then sees the change."""
    job, epoch, placer, update = sides
    tx = update.transaction()
    await tx.start()
    await lock(update, job)
    await update.execute("UPDATE jobs SET spec_version = spec_version + 1 WHERE job_id = $1", job)
    async with placer.transaction():
        placing = asyncio.ensure_future(_apply(placer, plan, {job: 1}, {job: 0}, epoch))
        done, _ = await asyncio.wait({placing}, timeout=WAIT_S)
        assert not done, f"the {what} did not wait for the update in flight"
        await tx.commit()
        await placing


async def test_an_update_waits_for_a_start_in_flight_then_reads_it(sides: Sides) -> None:
    rows = await update_behind(sides, start(sides.job), "start")
    assert rows[0]["alloc_nodes"] == ["n1"], "the update reads the job allocated"


async def test_a_start_waits_for_an_update_in_flight_then_is_withdrawn(
    db: asyncpg.Connection, sides: Sides
) -> None:
    await placer_behind(sides, start(sides.job), "start")
    assert await allocated(db, sides.job) == (0, 0), "the start was withdrawn"


async def running_victim(db: asyncpg.Connection, epoch: int) -> int:
    """A job holding node n1's GPU 0, for a preemption to ask."""
    victim = await insert_job(db, SPEC)
    async with db.transaction():
        await _apply(db, start(victim), {victim: 1}, {victim: 0}, epoch)
    return victim


async def test_a_preemption_planned_by_old_fields_is_not_asked(db: asyncpg.Connection) -> None:
    epoch = await acquire_lease(db, "test", 60.0)
    assert epoch is not None
    victim = await running_victim(db, epoch)
    job = await insert_job(db, SPEC)
    await db.execute("UPDATE jobs SET spec_version = 1 WHERE job_id = $1", job)
    async with db.transaction():
        await _apply(db, preempt(victim, job), {}, {job: 0}, epoch)  # read before the change
    assert await preempted(db, victim) == (0, 0)
    async with db.transaction():
        await _apply(db, preempt(victim, job), {}, {job: 1}, epoch)  # the next cycle's read
    assert await preempted(db, victim) == (1, 1)


async def test_a_preemption_waits_for_an_update_in_flight_then_is_not_asked(
    db: asyncpg.Connection, sides: Sides
) -> None:
    victim = await running_victim(db, sides.epoch)
    await placer_behind(sides, preempt(victim, sides.job), "preemption")
    assert await preempted(db, victim) == (0, 0), "the preemption was asked"


async def test_an_update_waits_for_a_preemption_in_flight(
    db: asyncpg.Connection, sides: Sides
) -> None:
    victim = await running_victim(db, sides.epoch)
    await update_behind(sides, preempt(victim, sides.job), "preemption")
    assert await preempted(db, victim) == (1, 1), "planned before the change: asked"
