"""The chaos bed's journal on a real PostgreSQL: node states are stamped as they commit,
placements as they are written, and invariant 4 is judged from them."""

from __future__ import annotations

import asyncpg

from tests.chaos import audit


async def test_a_node_placed_on_while_down_is_caught_and_one_that_came_back_is_not(
    db: asyncpg.Connection,
) -> None:
    await audit.install_journal(db)
    job = await db.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec)"
        " VALUES ('j', 'u', 'a', 'p', 'normal', 1, 1, 1, 60, '{}') RETURNING job_id"
    )
    await db.execute(
        "INSERT INTO placer_lease(id, holder, epoch, expires_at)"
        " VALUES (1, 'test', 1, now() + interval '1 hour')"
    )
    await db.execute("INSERT INTO nodes(name) VALUES ('n1'), ('n2')")
    await db.execute("UPDATE nodes SET state = 'DOWN' WHERE name = 'n1'")
    await db.execute("UPDATE nodes SET reason = 'heartbeat' WHERE name = 'n2'")  # no change
    async with db.transaction():
        alloc = await db.fetchval(
            "INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, 1, 1) RETURNING alloc_id",
            job,
        )
        await db.execute(
            "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus)"
            " VALUES ($1, 'n1', 0, '{0}'), ($1, 'n2', 1, '{0}')",
            alloc,
        )
    states = await db.fetch("SELECT node, state FROM chaos_node_states ORDER BY at")
    assert [(r["node"], r["state"]) for r in states] == [("n1", "UP"), ("n2", "UP"), ("n1", "DOWN")]
    found = await audit.excluded_nodes_unused(db)
    assert len(found) == 1 and "placed on n1 while it was DOWN" in found[0].detail

    await db.execute("UPDATE nodes SET state = 'UP' WHERE name = 'n1'")
    await db.execute("UPDATE allocations SET released_at = now() WHERE alloc_id = $1", alloc)
    async with db.transaction():
        again = await db.fetchval(
            "INSERT INTO allocations(job_id, attempt, epoch) VALUES ($1, 2, 1) RETURNING alloc_id",
            job,
        )
        await db.execute(
            "INSERT INTO allocation_nodes(alloc_id, node, rank, gpus) VALUES ($1, 'n1', 0, '{0}')",
            again,
        )
    assert len(await audit.excluded_nodes_unused(db)) == 1  # the first one only
