"""The job-size report's read on real PostgreSQL (services/fairshare/repo.py,
`allocated_in`): an allocation counts each node's GPUs for the time it held that node
inside the window, and is sized by the GPUs it was placed with."""

from __future__ import annotations

import asyncpg
import pytest

from services.admission.repo import insert_job
from services.fairshare.repo import allocated_in
from services.placer.core import Grant, Start
from services.placer.repo import acquire_lease, insert_allocation, swap_nodes
from shared.jobspec import JobSpec

SPEC = JobSpec(
    user="alice", account="a", partition="normal", script="#!/bin/bash\ntrue\n",
    nodes_min=2, nodes_max=2, gpus_per_node=2, time_limit_s=600,
)  # fmt: skip
T0 = 1_900_000_000.0  # placed; `lost` swapped for `spare` at +100 s; released at +300 s


@pytest.fixture
async def swapped(db: asyncpg.Connection) -> int:
    epoch = await acquire_lease(db, "test", 60.0)
    assert epoch is not None
    job_id = await insert_job(db, SPEC)
    grants = (Grant(node="kept", gpus=(0, 1)), Grant(node="lost", gpus=(0, 1)))
    alloc = await insert_allocation(db, Start(job_id=job_id, grants=grants), 1, epoch)
    await swap_nodes(db, alloc, ("lost",), (Grant(node="spare", gpus=(0, 1)),))
    await db.execute(
        "UPDATE allocations SET created_at = to_timestamp($2),"
        " released_at = to_timestamp($2 + 300) WHERE alloc_id = $1",
        alloc, T0,
    )  # fmt: skip
    await db.execute(
        "UPDATE allocation_nodes SET"
        " added_at = to_timestamp($2 + CASE node WHEN 'spare' THEN 100 ELSE 0 END),"
        " dropped_at = CASE node WHEN 'lost' THEN to_timestamp($2 + 100) END"
        " WHERE alloc_id = $1",
        alloc, T0,
    )  # fmt: skip
    return job_id


@pytest.mark.parametrize(
    ("since", "until", "gpu_seconds"),
    [
        (T0 - 50, T0 + 400, 2 * 300 + 2 * 100 + 2 * 200),  # the whole life
        (T0 - 50, T0 + 50, 2 * 50 + 2 * 50),  # before the swap: kept and lost
        (T0 + 150, T0 + 250, 2 * 100 + 2 * 100),  # after it: kept and the spare
        (T0 + 50, T0 + 150, 2 * 100 + 2 * 50 + 2 * 50),  # across it
    ],
    ids=["whole", "before", "after", "across"],
)
async def test_a_swapped_node_counts_until_it_left_and_the_spare_from_its_arrival(
    db: asyncpg.Connection, swapped: int, since: float, until: float, gpu_seconds: float
) -> None:
    [row] = await allocated_in(db, since, until)
    assert (row.job_id, row.account, row.gpus) == (swapped, "a", 4)
    assert row.gpu_seconds == pytest.approx(gpu_seconds)


async def test_a_window_after_the_release_counts_nothing(
    db: asyncpg.Connection, swapped: int
) -> None:
    assert await allocated_in(db, T0 + 300, T0 + 900) == []
