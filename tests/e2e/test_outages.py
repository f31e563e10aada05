"""End to end: the control plane rides out outages of its servers (invariant 9).

A local cluster on its own PostgreSQL or NATS (so killing it does not break the
session's servers): PostgreSQL killed -9 and restarted on the same port, NATS killed -9
for a few seconds and restarted on the same port and store. Every service process must
still run afterwards, nothing may be dead-lettered, jobs submitted around the outage
run, and running jobs keep their one copy where they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.client import ApiRefused
from muster.cluster import SERVICES, Cluster
from shared import embedded
from shared.bus import DLQ_STREAM, Bus
from shared.db import migrate
from tests.support.cluster import eventually, job_state, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

DONE = "COMPLETED"
PG_OUTAGE_S = 15.0  # what the operator saw; longer than the old redelivery budget
NATS_OUTAGE_S = 5.0
# Silence that makes a node SUSPECT (2 s) is shorter than the NATS outage; the agents'
# fence and DOWN are longer, so nothing may be stopped or moved.
NATS_ENV = {"MUSTER_HEARTBEAT_TIMEOUT_S": "2", "MUSTER_FENCE_S": "20", "MUSTER_DOWN_AFTER_S": "30"}


@pytest.fixture
def own_dir() -> Iterator[Path]:
    """Outside pytest's folder: a concurrent pytest session resets the permissions of
    its root, which the PostgreSQL system user must traverse."""
    with tempfile.TemporaryDirectory(prefix="muster-outage-", ignore_cleanup_errors=True) as d:
        yield Path(d)


class OwnPostgres:
    """A PostgreSQL server of this test only, which it may kill and restart. Not `fast`:
    with synchronous_commit off a crash loses the last commits, which a real server
    never does and this test must not see."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.server = embedded.start_postgres(state)
        self.port = int(self.server.url.rsplit(":", 1)[1])
        self.url = embedded.create_database(self.server.url, "muster")

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server = embedded.start_postgres(self.state, self.port)

    async def fetchval(self, sql: str, *args: object) -> object:
        """One query on a fresh connection: it must work on either side of a restart."""
        conn = await asyncpg.connect(self.url, timeout=5)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()


async def _migrated(url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(url)
    await migrate(conn)
    return conn


def _services_alive(cluster: Cluster) -> dict[str, bool]:
    return {key: cluster.procs[key].poll() is None for key in SERVICES}


async def _dead_letters(nats_url: str) -> int:
    bus = await Bus.connect(nats_url, name="outage-test")
    try:
        info = await bus.js.stream_info(DLQ_STREAM)
        count: int = info.state.messages
        return count
    finally:
        await bus.close()


async def _submit_when_accepted(nats_url: str, script: str, timeout_s: float = 60.0) -> int:
    """Submit, retrying while admission says the control plane is unavailable."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return (await submit(nats_url, script)).job_ids[0]
        except (ApiRefused, TimeoutError) as err:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"admission never accepted the job: {err!r}") from err
            await asyncio.sleep(0.5)


@pytest.fixture
async def pg(own_dir: Path) -> AsyncIterator[OwnPostgres]:
    own = await asyncio.to_thread(OwnPostgres, own_dir / "pg-state")
    try:
        yield own
    finally:
        own.server.stop()


async def test_postgresql_killed_and_restarted_mid_run_loses_no_job_and_no_service(
    tmp_path: Path, nats_url: str, pg: OwnPostgres
) -> None:
    db = await _migrated(pg.url)
    async with running_cluster(tmp_path / "state", nats_url, pg.url, db, nodes(2)) as cluster:
        await db.close()
        # Its workers exit during the outage: the launcher's worker.exited handler meets
        # a dead database and must apply the event once PostgreSQL is back.
        running = (await submit(nats_url, "#!/bin/bash\nsleep 4\n")).job_ids[0]
        await eventually(
            lambda: pg.fetchval("SELECT state FROM job_runs WHERE job_id = $1", running),
            lambda s: s == "RUNNING",
            timeout=60,
            what="a job running before the outage",
        )

        await asyncio.to_thread(pg.kill)
        during: int | None = None
        with contextlib.suppress(ApiRefused, TimeoutError):  # refused while it is down
            during = (await submit(nats_url, "#!/bin/bash\ntrue\n")).job_ids[0]
        await asyncio.sleep(PG_OUTAGE_S)
        await asyncio.to_thread(pg.restart)

        after = await _submit_when_accepted(nats_url, "#!/bin/bash\ntrue\n")
        jobs = [running, after] + ([during] if during is not None else [])
        for job_id in jobs:
            await eventually(
                partial(pg.fetchval, "SELECT state FROM job_runs WHERE job_id = $1", job_id),
                lambda s: s == DONE,
                timeout=120,
                what=f"job {job_id} completes after the outage",
            )
        assert _services_alive(cluster) == dict.fromkeys(SERVICES, True)
        assert await _dead_letters(nats_url) == 0


class OwnNats:
    """A NATS server of this test only, restarted on the same port and store."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.server = embedded.start_nats(state)
        self.url = self.server.url
        self.port = int(self.url.rsplit(":", 1)[1])

    def kill(self) -> None:
        self.server.kill()

    def restart(self) -> None:
        self.server = embedded.start_nats(self.state, self.port)


def _workers(marker: str) -> list[int]:
    """The pids of the job's workers, as `ps` sees them on this machine."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return sorted(int(line.split()[0]) for line in out.splitlines() if marker in line)


async def _placement(db: asyncpg.Connection, job_id: int) -> list[tuple[int, int, str]]:
    rows = await db.fetch(
        "SELECT a.alloc_id, a.attempt, n.node FROM allocations a"
        " JOIN allocation_nodes n USING (alloc_id)"
        " WHERE a.job_id = $1 ORDER BY a.alloc_id, n.node",
        job_id,
    )
    return [(r["alloc_id"], r["attempt"], r["node"]) for r in rows]


async def test_nats_killed_and_restarted_keeps_every_service_and_moves_no_job(
    tmp_path: Path, own_dir: Path, database_url: str, db: asyncpg.Connection
) -> None:
    bus_server = await asyncio.to_thread(OwnNats, own_dir / "nats-state")
    seconds = f"{40 + uuid.uuid4().int % 1000 / 1000:.3f}"  # a unique `sleep` to find
    marker = f"sleep {seconds}"
    try:
        async with running_cluster(
            tmp_path / "state", bus_server.url, database_url, db, nodes(2), env=NATS_ENV
        ) as cluster:
            script = f"#!/bin/bash\n#SBATCH --nodes=2\n{marker}\n"
            job_id = (await submit(bus_server.url, script)).job_ids[0]
            await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60)
            before = await eventually(lambda: asyncio.to_thread(_workers, marker), _two, 30)
            placed = await _placement(db, job_id)

            await asyncio.to_thread(bus_server.kill)
            await asyncio.sleep(NATS_OUTAGE_S)
            await asyncio.to_thread(bus_server.restart)
            await asyncio.sleep(8)  # past the heartbeat timeout again, with NATS back

            assert _services_alive(cluster) == dict.fromkeys(SERVICES, True)
            assert await asyncio.to_thread(_workers, marker) == before  # same one copy
            assert await _placement(db, job_id) == placed
            assert await job_state(db, job_id) == "RUNNING"
            down = await db.fetchval("SELECT count(*) FROM nodes WHERE state = 'DOWN'")
            assert down == 0
            assert await _dead_letters(bus_server.url) == 0
    finally:
        bus_server.server.stop()


def _two(pids: list[int]) -> bool:
    return len(pids) == 2
