"""Shell: watches a chaos run as it goes, once a second.

Each tick reads the machine first (every live worker of the run, from /proc), then the
database (runs, allocations, node states and the last progress, on the database's
clock), and hands both to the pure `Watch` (tests/chaos/checker.py). The machine comes
first so that every worker it saw had its allocation written already. While
PostgreSQL is away a tick is skipped: the outage is a fault being carried out.
It also times recovery: a fault is over when the first job progress (a generation
started, a job ended) is committed after the fault was undone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from tests.chaos.checker import Invariant, LeaseWatch, NodeSample, Run, Violation, Watch
from tests.chaos.faults import FaultRecord
from tests.chaos.machine import still_alive, workers

PERIOD_S = 1.0
# InternalClientError: a connection left mid-operation by a timeout is unusable after.
DB_ERRORS = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions._base.InternalClientError,
    TimeoutError,
)

RUNS = (
    "SELECT job_id, state, attempt, restart_count,"
    " extract(epoch FROM ended_at)::float8 AS ended_at FROM job_runs"
)
ALLOCATED = (
    "SELECT a.job_id, a.attempt, array_agg(n.node) AS nodes FROM allocations a"
    " JOIN allocation_nodes n USING (alloc_id) GROUP BY a.job_id, a.attempt"
)
HELD_TWICE = (
    "SELECT g.node, g.gpu, array_agg(g.alloc_id) AS holders FROM allocation_gpus g"
    " JOIN allocations a USING (alloc_id) WHERE g.live AND a.released_at IS NULL"
    " GROUP BY g.node, g.gpu HAVING count(*) > 1"
)
NODES = "SELECT name, state, extract(epoch FROM now())::float8 AS t FROM nodes"
LEASES = (
    "SELECT 'placer' AS name, holder, epoch FROM placer_lease"
    " UNION ALL SELECT 'health', holder, epoch FROM health_lease"
    " UNION ALL SELECT 'launcher shard ' || shard, holder, epoch FROM launcher_shards"
)
PROGRESS = (
    "SELECT extract(epoch FROM greatest("
    " (SELECT max(started_at) FROM attempts), (SELECT max(ended_at) FROM job_runs)))::float8"
)


@dataclass
class Sampler:
    database_url: str
    workdir: Path
    watch: Watch = field(default_factory=Watch)
    leases: LeaseWatch = field(default_factory=LeaseWatch)
    violations: list[Violation] = field(default_factory=list)
    node_samples: dict[str, list[NodeSample]] = field(default_factory=dict)
    open_faults: list[FaultRecord] = field(default_factory=list)
    ticks: int = 0
    workers_seen: int = 0  # worker sightings: the machine checks saw something

    def watch_recovery(self, record: FaultRecord) -> None:
        self.open_faults.append(record)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(self._loop(stop))
        try:
            yield
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    async def _loop(self, stop: asyncio.Event) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                try:
                    conn = (
                        conn
                        if conn is not None and not conn.is_closed()
                        else (await asyncpg.connect(self.database_url, timeout=2))
                    )
                    await self._tick(conn)
                except DB_ERRORS:
                    if conn is not None:
                        conn.terminate()  # it may be mid-operation: never reuse it
                    conn = None  # PostgreSQL is away: skip this tick
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PERIOD_S)
        finally:
            if conn is not None and not conn.is_closed():
                await conn.close(timeout=5)

    async def _tick(self, conn: asyncpg.Connection) -> None:
        seen = await asyncio.to_thread(workers, self.workdir)
        runs = {
            r["job_id"]: Run(r["state"], r["attempt"], r["restart_count"], r["ended_at"])
            for r in await conn.fetch(RUNS, timeout=5)
        }
        allocated = {
            (r["job_id"], r["attempt"]): frozenset(r["nodes"])
            for r in await conn.fetch(ALLOCATED, timeout=5)
        }
        for r in await conn.fetch(NODES, timeout=5):
            self.node_samples.setdefault(r["name"], []).append(NodeSample(r["t"], r["state"]))
        progress = await conn.fetchval(PROGRESS, timeout=5)
        self.violations += self.leases.observe(
            {r["name"]: (r["holder"], r["epoch"]) for r in await conn.fetch(LEASES, timeout=5)}
        )
        self.violations += [
            Violation(
                Invariant.GPU_ONCE,
                f"GPU {r['gpu']} of {r['node']} live in allocations {sorted(r['holders'])}",
            )
            for r in await conn.fetch(HELD_TWICE, timeout=5)
        ]
        alive = [p for p in seen if still_alive(p)]  # both alive at once, or not a clash
        t = max(s[-1].t for s in self.node_samples.values()) if self.node_samples else 0.0
        self.violations += self.watch.observe(t, alive, runs, allocated)
        self._recoveries(progress)
        self.ticks += 1
        self.workers_seen += len(alive)

    def _recoveries(self, progress: float | None) -> None:
        if progress is None:
            return
        for record in list(self.open_faults):
            if record.undone and progress > record.undone:
                record.recovered_s = progress - record.began
                self.open_faults.remove(record)
