"""End to end: two live placer replicas (real processes on real NATS and PostgreSQL).
One leads; killed, the other takes over within the lease; paused (SIGSTOP) inside its
cycle, within seconds (the cycle's idle limit); paused and resumed
after the other took over, it writes nothing (the fencing epoch), and the database
refuses its epoch. No GPU is ever held by two allocations at once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import eventually, kill9, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

SLEEPER = "#!/bin/bash\nsleep 600\n"
LEASE_TTL_S = 2.0  # FAST in tests/support/cluster.py


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(3), replicas={"placer": 2}
    ) as c:
        yield c


async def lease(db: asyncpg.Connection) -> tuple[str, int] | None:
    row = await db.fetchrow("SELECT holder, epoch FROM placer_lease WHERE id = 1")
    return None if row is None else (row["holder"], row["epoch"])


def key_of(holder: str) -> str:
    """The process key of a lease holder (`placer-<instance>-<nonce>`)."""
    instance = holder.split("-")[1]
    return "placer" if instance == "0" else f"placer-{instance}"


async def placed(db: asyncpg.Connection, url: str, what: str) -> int:
    """Submit a whole-node job and wait for its allocation: the placer's own write."""
    job_id = (await submit(url, SLEEPER, ("--gpus-per-node=4",))).job_ids[0]
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL", job_id
        ),
        lambda n: n == 1,
        60,
        what,
    )
    return job_id


async def gpus_held_twice(db: asyncpg.Connection) -> list[asyncpg.Record]:
    """Pairs of allocations that held one GPU at overlapping times, released or not."""
    return await db.fetch(
        "SELECT a.alloc_id, b.alloc_id AS other, ga.node, ga.gpu"
        " FROM allocation_gpus ga JOIN allocation_gpus gb"
        "   ON ga.node = gb.node AND ga.gpu = gb.gpu AND ga.alloc_id < gb.alloc_id"
        " JOIN allocations a ON a.alloc_id = ga.alloc_id"
        " JOIN allocations b ON b.alloc_id = gb.alloc_id"
        " WHERE tstzrange(a.created_at, a.released_at) && tstzrange(b.created_at, b.released_at)"
    )


async def test_killing_the_leading_placer_hands_over_within_the_lease(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = await eventually(lambda: lease(db), lambda r: r is not None, 30, "a leader")
    assert first is not None
    await placed(db, cluster.nats_url, "a job placed by the first leader")

    kill9(cluster, key_of(first[0]))
    took = asyncio.get_running_loop().time()
    second = await eventually(
        lambda: lease(db), lambda r: r is not None and r[1] > first[1], 30, "a new leader"
    )
    handover = asyncio.get_running_loop().time() - took
    assert second is not None and key_of(second[0]) != key_of(first[0])
    job = await placed(db, cluster.nats_url, "a job placed by the new leader")

    epoch = await db.fetchval("SELECT epoch FROM allocations WHERE job_id = $1", job)
    assert epoch == second[1]
    assert handover < LEASE_TTL_S + 10  # generous: the lease, a renew period, a busy box
    assert await gpus_held_twice(db) == []


async def test_a_paused_leader_resumed_after_a_takeover_writes_nothing(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = await eventually(lambda: lease(db), lambda r: r is not None, 30, "a leader")
    assert first is not None
    old_key = key_of(first[0])
    await placed(db, cluster.nats_url, "a job placed by the first leader")

    os.kill(cluster.pids[old_key], signal.SIGSTOP)
    try:
        second = await eventually(
            lambda: lease(db), lambda r: r is not None and r[1] > first[1], 90, "a takeover"
        )
        assert second is not None
        job = await placed(db, cluster.nats_url, "a job placed while the old leader sleeps")
    finally:
        os.kill(cluster.pids[old_key], signal.SIGCONT)
    resumed = await db.fetchval("SELECT now()")
    log = cluster.state_dir / "logs" / f"{old_key}.log"
    await eventually(
        lambda: asyncio.to_thread(log.read_text),
        lambda text: "lost the placer lease" in text,
        30,
        "the resumed placer notices it lost",
    )
    later = await placed(db, cluster.nats_url, "a job placed after the old leader woke")

    # Every write since the takeover came from the new epoch; the old one made none.
    stale = await db.fetchval(
        "SELECT count(*) FROM allocations WHERE epoch = $1 AND created_at >= $2",
        first[1],
        resumed,
    )
    assert stale == 0
    epochs = await db.fetch(
        "SELECT DISTINCT epoch FROM allocations WHERE job_id = ANY($1::bigint[])", [job, later]
    )
    assert [r["epoch"] for r in epochs] == [second[1]]
    # And the database itself refuses the old epoch (the trigger, the last defence).
    with pytest.raises(asyncpg.RaiseError, match="fenced off"):
        await db.execute(
            "INSERT INTO allocations (job_id, attempt, epoch) VALUES ($1, 99, $2)",
            later,
            first[1],
        )
    assert await gpus_held_twice(db) == []


async def test_a_stopped_leader_hands_its_lease_over_at_once(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = await eventually(lambda: lease(db), lambda r: r is not None, 30, "a leader")
    assert first is not None
    key = key_of(first[0])
    cluster.kill(key, signal.SIGTERM)  # a clean stop: a rolling restart, `muster down`
    assert cluster.procs[key].wait(30) == 0
    log = (cluster.state_dir / "logs" / f"{key}.log").read_text()
    assert "released the placer lease" in log
    second = await eventually(
        lambda: lease(db), lambda r: r is not None and r[1] > first[1], 30, "a new leader"
    )
    assert second is not None and key_of(second[0]) != key
    await placed(db, cluster.nats_url, "a job placed by the new leader")


# A cycle's transaction between two statements, holding the lease row (FOR UPDATE)
HOLDING_LEASE = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.relation = 'placer_lease'::regclass AND l.granted"
    " AND a.state = 'idle in transaction')"
)


async def stop_mid_cycle(db: asyncpg.Connection, pid: int, within_s: float = 60.0) -> int:
    """SIGSTOP the placer `pid` while its cycle's transaction holds the lease row; tried
    again (SIGCONT) until the stop lands inside one. Returns the tries it took."""
    deadline = asyncio.get_running_loop().time() + within_s
    tries = 0
    while True:
        if await db.fetchval(HOLDING_LEASE):
            tries += 1
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(0.3)
            if await db.fetchval(HOLDING_LEASE):
                return tries
            os.kill(pid, signal.SIGCONT)
        assert asyncio.get_running_loop().time() < deadline, f"no cycle caught in {tries} tries"


async def test_a_leader_paused_inside_its_cycle_is_replaced_within_seconds(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """The paused leader's transaction holds the lease row, so no standby can take the
    lease until PostgreSQL ends that session: the cycle's idle limit (twice the lease),
    not the pool's minute. Before, the takeover waited 60 s."""
    first = await eventually(lambda: lease(db), lambda r: r is not None, 30, "a leader")
    assert first is not None
    old_key = key_of(first[0])
    await placed(db, cluster.nats_url, "a job placed by the first leader")
    await stop_mid_cycle(db, cluster.pids[old_key])
    took = asyncio.get_running_loop().time()
    try:
        second = await eventually(
            lambda: lease(db), lambda r: r is not None and r[1] > first[1], 90, "a takeover"
        )
        handover = asyncio.get_running_loop().time() - took
        assert second is not None and key_of(second[0]) != old_key
        await placed(db, cluster.nats_url, "a job placed while the old leader sleeps")
    finally:
        os.kill(cluster.pids[old_key], signal.SIGCONT)
    assert handover < 30, f"the takeover took {handover:.1f} s"
    assert await gpus_held_twice(db) == []
