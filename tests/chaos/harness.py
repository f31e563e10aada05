"""Shell: one seeded chaos run, start to verdict.

`run_chaos(settings)` brings up a bed of its own (a PostgreSQL and a NATS server
it may kill, every service, one node agent per node, each agent in its own network
namespace where the machine allows, so a node can be partitioned; secured as `muster up`
runs unless `secure=False`: bus credentials and permissions per service and per node,
SCRAM PostgreSQL with a role per service, signed requests), sends one poison
message, runs the mixed workload while it carries out the seeded fault schedule, lets
every accepted job finish, and returns a `Report`: what it did, and every violation of
invariants 1-9 it found on the machine (sampled through the run) and in the database
and the dead-letter stream (at the end). Replay a run with its seed. The run's folder
(servers' stores and logs, the jobs' output) is removed when the run kept every
invariant and kept, named in the verdict, when it did not or raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from services.launcher.coordinator_core import APP_FAULT
from shared.states import TERMINAL
from tests.chaos import audit, secured
from tests.chaos.bed import ChaosBed, chaos_bed
from tests.chaos.checker import Violation, tally
from tests.chaos.faults import FaultRecord, carry_out, resume
from tests.chaos.machine import workers
from tests.chaos.sampler import Sampler
from tests.chaos.schedule import ALL_KINDS, Fault, Kind, counts, schedule
from tests.chaos.workload import POISON, Workload, send_poison


@dataclass(frozen=True)
class ChaosSettings:
    seed: int
    n_faults: int
    duration_s: float
    kinds: tuple[Kind, ...] = ALL_KINDS
    nodes: int = 3
    replicas: int = 1  # of every service, as muster.cluster plans them
    nats_servers: int = 1  # 3: a JetStream cluster, streams at R3 (no partitions then)
    drain_s: float = 120.0
    secure: bool = True  # False: the old bed, no bus auth, `trust` PostgreSQL logins


@dataclass
class Report:
    seed: int
    faults: list[FaultRecord] = field(default_factory=list)
    jobs_submitted: int = 0
    job_states: dict[str, int] = field(default_factory=dict)
    step_states: dict[str, int] = field(default_factory=dict)  # the srun steps' ends
    # jobs that ended badly (FAILED, NODE_FAIL, ...): "STATE: reason", so a run that
    # failed a job no fault explains says which and why
    failed: dict[int, str] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    orphans: int = 0
    services_exited: list[str] = field(default_factory=list)
    poison_copies: int = 0
    refused: int = 0
    workers_seen: int = 0  # 0 would mean the machine checks judged nothing
    secure: bool = True
    cancels: int = 0
    forged_refused: int = 0
    forged_accepted: list[int] = field(default_factory=list)  # a forged cancel's jobs
    unsecured: list[str] = field(default_factory=list)  # lapses of a secured bed's auth
    folder: Path | None = None  # the run's servers' logs and the jobs' output

    def summary(self) -> dict[str, object]:
        return {
            "seed": self.seed,
            "auth": "on" if self.secure else "off",
            "faults_injected": counts([r.fault for r in self.faults]),
            "jobs_submitted": self.jobs_submitted,
            "jobs_completed": self.job_states.get("COMPLETED", 0),
            "job_states": self.job_states,
            "step_states": self.step_states,
            "failed": {str(j): why for j, why in sorted(self.failed.items())},
            "kept": str(self.folder) if self.folder and self.folder.exists() else "",
            "violations": tally(self.violations),
            "orphans": self.orphans,
            "services_exited": self.services_exited,
            "poison_copies": self.poison_copies,
            "submits_refused": self.refused,
            "workers_seen": self.workers_seen,
            "cancels": self.cancels,
            "forged_cancels_refused": self.forged_refused,
            "forged_cancels_accepted": len(self.forged_accepted),
            "auth_lapses": len(self.unsecured),
            "failover_s": failover(self.faults),
        }

    def unexplained(self) -> dict[int, str]:
        """The jobs that ended badly for a reason other than an application XID (which
        fails its job by design): no invariant broke, but the run's folder is kept for
        reading, as a failing run's is."""
        return {j: why for j, why in self.failed.items() if APP_FAULT not in why}

    def verdict(self) -> str:
        """Empty when the run kept every invariant; else what broke, and how to replay."""
        broken = [f"invariant {v.invariant.value}: {v.detail}" for v in self.violations]
        broken += [f"{key} exited during the run" for key in self.services_exited]
        broken += [f"{self.orphans} worker processes outlived the run"] if self.orphans else []
        broken += [f"not secured: {lapse}" for lapse in self.unsecured]
        broken += [f"mallory's forged cancel of job {j} was accepted" for j in self.forged_accepted]
        if not broken:
            return ""
        insecure = "" if self.secure else "MUSTER_CHAOS_INSECURE=1 "
        replay = f"{insecure}MUSTER_CHAOS_SEED={self.seed} pytest tests/chaos"
        head = f"chaos seed {self.seed} failed; replay: {replay}; logs in {self.folder}"
        return "\n".join([head, *broken[:40]])


def failover(records: list[FaultRecord]) -> dict[str, dict[str, float]]:
    """p50/p99 seconds per kind from a fault to the first progress after its undo."""
    by_kind: dict[str, list[float]] = {}
    for r in records:
        if r.recovered_s is not None:
            by_kind.setdefault(r.fault.kind.value, []).append(r.recovered_s)
    return {kind: _percentiles(xs) for kind, xs in sorted(by_kind.items())}


def _percentiles(xs: list[float]) -> dict[str, float]:
    if len(xs) == 1:
        return {"n": 1, "p50": round(xs[0], 3), "p99": round(xs[0], 3)}
    cuts = statistics.quantiles(xs, n=100, method="inclusive")
    return {"n": len(xs), "p50": round(cuts[49], 3), "p99": round(cuts[98], 3)}


async def run_chaos(settings: ChaosSettings) -> Report:
    folder = Path(tempfile.mkdtemp(prefix=f"muster-chaos-{settings.seed}-"))
    report = await _run(settings, folder)
    report.folder = folder
    if not report.verdict() and not report.unexplained():
        shutil.rmtree(folder, ignore_errors=True)
    return report


async def _run(settings: ChaosSettings, folder: Path) -> Report:
    workdir = folder / "work"
    workdir.mkdir()
    async with chaos_bed(
        folder,
        n_nodes=settings.nodes,
        replicas=settings.replicas,
        nats_servers=settings.nats_servers,
        partitions=Kind.PARTITION in settings.kinds,
        secure=settings.secure,
    ) as bed:
        kinds = tuple(k for k in settings.kinds if k is not Kind.PARTITION or bed.net)
        plan = schedule(settings.seed, kinds, settings.n_faults, settings.duration_s, bed.targets())
        report = Report(settings.seed, secure=bed.secure)
        report.unsecured = await secured.lapses(bed) if bed.secure else []
        sampler = Sampler(bed.database_url, workdir)
        workload = Workload(bed.url, workdir, settings.seed)
        await send_poison(bed.url)
        async with sampler.running():
            await _fault_phase(bed, plan, workload, sampler, report)
            await _drain(bed, settings.drain_s)
        report.jobs_submitted = len(workload.accepted)
        report.refused = workload.refused
        report.cancels, report.forged_refused = workload.cancels, workload.forged_refused
        report.forged_accepted = workload.forged_accepted
        report.workers_seen = sampler.workers_seen
        report.orphans = await _orphans(workdir)
        report.violations = sampler.violations + await _audit(bed, sampler, workload, report)
        # A node agent counts too: an outage delays it, never ends it.
        report.services_exited = [
            k for k, proc in bed.cluster.procs.items() if proc.poll() is not None
        ]
    return report


async def _fault_phase(
    bed: ChaosBed, plan: list[Fault], workload: Workload, sampler: Sampler, report: Report
) -> None:
    stop = asyncio.Event()
    t0 = time.monotonic()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(workload.run(stop))
        try:
            for fault in plan:
                await asyncio.sleep(max(0.0, t0 + fault.at - time.monotonic()))
                record = await carry_out(bed, fault)
                report.faults.append(record)
                sampler.watch_recovery(record)
        finally:
            stop.set()


async def _drain(bed: ChaosBed, timeout_s: float) -> None:
    """Return every node an XID took out, then wait for every job to end."""
    for node in bed.cluster.nodes:
        await resume(bed.url, node)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError, TimeoutError):
            conn = await asyncpg.connect(bed.database_url, timeout=5)
            try:
                left = await conn.fetchval(
                    "SELECT count(*) FROM jobs j LEFT JOIN job_runs r USING (job_id)"
                    " WHERE r.state IS NULL OR r.state <> ALL($1::text[])",
                    sorted(TERMINAL),
                )
            finally:
                await conn.close()
            if left == 0:
                return
        await asyncio.sleep(1.0)


async def _orphans(workdir: Path) -> int:
    """Workers of this run still alive once every job ended (given the grace a stop takes)."""
    deadline = time.monotonic() + 15.0
    left = await asyncio.to_thread(workers, workdir)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        left = await asyncio.to_thread(workers, workdir)
    for proc in left:  # counted; now gone, so the next run's machine is clean
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    return len(left)


async def _audit(
    bed: ChaosBed, sampler: Sampler, workload: Workload, report: Report
) -> list[Violation]:
    conn = await asyncpg.connect(bed.database_url, timeout=10)
    try:
        found, report.job_states = await audit.jobs_kept(conn, workload.accepted)
        found += await audit.gpus_held_once(conn)
        found += await audit.gangs_whole(conn)
        found += await audit.excluded_nodes_unused(conn)
        found += await audit.one_placer(conn)
        found += await audit.fences_in_place(conn)
        found += await _settled(conn, audit.usage_once)
        found += await _settled(conn, audit.steps_settled)
        found += await audit.step_gpus_held_once(conn)
        rows = await conn.fetch("SELECT state, count(*) AS n FROM job_steps GROUP BY state")
        report.step_states = {r["state"]: r["n"] for r in rows}
        report.failed = await audit.ended_badly(conn)
    finally:
        await conn.close()
    letters, report.poison_copies = await audit.dead_letters(bed.url, POISON)
    return found + letters


async def _settled(
    conn: asyncpg.Connection,
    check: Callable[[asyncpg.Connection], Awaitable[list[Violation]]],
    timeout_s: float = 30.0,
) -> list[Violation]:
    """What settles after the job ends (fairshare charges its usage, a launcher records
    its steps' ends): given time to settle."""
    deadline = time.monotonic() + timeout_s
    found = await check(conn)
    while found and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        found = await check(conn)
    return found
