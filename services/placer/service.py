"""Placer shell: events and a timer trigger a cycle; a cycle is one transaction:
lock the lease (fencing epoch) -> release what ended -> snapshot -> core -> allocations +
outbox. Only the lease holder places; a deposed placer's inserts are refused by the
database trigger.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from datetime import UTC, datetime

import msgspec
from opentelemetry import trace

from services.placer import repo
from services.placer.core import (
    MUSTER_POLICY,
    JobRequest,
    Plan,
    PolicyConfig,
    Snapshot,
    Wait,
    describe,
    place_keeping,
    place_spares,
)
from services.placer.core.blockers import blockers
from services.placer.core.exclusions import standing
from services.placer.core.predict import Predictor, explained_end, with_predictions
from shared.bus import NotMine
from shared.db import Conn, OutboxRow, hold_job_changes, inbox_first_time, outbox_add
from shared.events import (
    AnyEvent,
    Grant,
    JobAllocated,
    JobFinished,
    JobPreemptRequested,
    JobSparesAnswered,
    JobSparesRequested,
    JobSubmitted,
)
from shared.logs import kv
from shared.node_size import per_node, whole_memory
from shared.runtime import ServiceContext, every, until_stopped
from shared.settings import PlacerSettings
from shared.telemetry import remember_job_trace
from shared.transient import is_transient
from shared.waits import woken

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

SUBJECTS = (
    "muster.job.submitted",
    "muster.job.finished",
    "muster.job.requeued",
    "muster.job.reconfigured",
    "muster.job.cancel_requested",
    "muster.job.spares_requested",
    "muster.node.>",
)


LEASE_RELEASE_S = 2.0  # how long a stopping placer tries to hand its lease over


class Placer:
    def __init__(
        self, ctx: ServiceContext[PlacerSettings], policy: PolicyConfig | None = None
    ) -> None:
        self.ctx = ctx
        ctx.pruner.keep(repo.PRUNE_CYCLES)  # its cycle log, `placer_cycles`
        self.policy = policy or MUSTER_POLICY
        self.holder = f"placer-{ctx.settings.instance}-{uuid.uuid4().hex[:8]}"
        self.epoch: int | None = None
        self.cycles = 0
        self._wake = asyncio.Event()
        self._woken_at: float | None = None  # first wake-up not yet served by a cycle
        self._reasons: dict[int, Wait] = {}  # pending reasons as last written
        self._ends: dict[int, tuple[float, str]] = {}  # running jobs' predicted ends, written
        self._predictor: Predictor | None = None  # job history, loaded once when leading
        self._finished: set[int] = set()  # jobs finished since: the predictor adds them

    async def run(self, stop: asyncio.Event) -> None:
        await until_stopped(
            stop,
            self._consume,
            self._lease_loop,
            self._cycle_loop,
            self.ctx.relay.run,
            self.ctx.pruner.run,
        )
        await self._release_lease()

    async def _release_lease(self) -> None:
        """A clean stop hands the lease over at once instead of after its TTL."""
        epoch, self.epoch = self.epoch, None
        if epoch is None:
            return
        try:
            async with asyncio.timeout(LEASE_RELEASE_S), self.ctx.pool.acquire() as conn:
                await repo.release_lease(conn, self.holder, epoch)
        except Exception as err:  # PostgreSQL away: the lease simply expires
            if not is_transient(err):
                raise
            log.warning("lease not released", extra=kv(epoch=epoch, error=repr(err)))
            return
        log.info("released the placer lease", extra=kv(epoch=epoch))

    async def _consume(self, stop: asyncio.Event) -> None:
        # One message per pull: every event is only a wake-up, and a batch pull that has
        # one message in hand waits for more until its deadline (up to 1 s) before
        # returning it -- the submit right after a job's end waited out that deadline.
        await self.ctx.bus.consume("placer", SUBJECTS, self.handle, stop, batch=1)

    async def handle(self, event: AnyEvent) -> None:
        """Every event the placer hears is a reason to look again; state is in the DB.
        A request for spares is answered at once (the job is stopped, waiting)."""
        if isinstance(event, JobSparesRequested):
            await self.grant_spares(event)
        if isinstance(event, JobFinished):
            self._finished.add(event.job_id)  # one more outcome to learn
            if len(self._finished) > repo.HISTORY:  # a long standby: reload it all
                self._predictor, self._finished = None, set()
        if isinstance(event, JobSubmitted):
            remember_job_trace(event)  # its allocation continues the job's trace
        self.wake()

    @property
    def _idle_s(self) -> float:
        """How long a cycle's transaction may sit between statements (`lock_lease`)."""
        return 2 * self.ctx.settings.lease_ttl_s

    def wake(self) -> None:
        if self._woken_at is None:
            self._woken_at = time.perf_counter()
        self._wake.set()

    async def grant_spares(self, ask: JobSparesRequested) -> None:
        epoch = self.epoch
        if epoch is None:
            raise NotLeading("spares are granted by the leading placer")
        answer = JobSparesAnswered(job_id=ask.job_id, attempt=ask.attempt, reason="no free node")
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, "placer", ask.event_id):
                return
            if not await repo.lock_lease(conn, self.holder, epoch, self._idle_s):
                raise NotLeading("lost the lease while granting spares")
            alloc = await repo.live_allocation(conn, ask.job_id)
            if alloc is not None and alloc.attempt == ask.attempt:
                snapshot = Snapshot(
                    nodes=await repo.load_nodes(conn), running=await repo.load_running(conn)
                )
                start = place_spares(snapshot, _spare_gang(ask, alloc), ask.keep, time.time())
                if start is not None:
                    drop = tuple(n for n in alloc.nodes if n not in ask.keep)
                    await repo.swap_nodes(conn, alloc.alloc_id, drop, start.grants)
                    grants = tuple(Grant(node=g.node, gpus=g.gpus) for g in start.grants)
                    answer = msgspec.structs.replace(answer, grants=grants, reason=describe(start))
            await outbox_add(conn, answer)
        self.ctx.relay.kick()
        log.info(
            "spares",
            extra=kv(job=ask.job_id, granted=[g.node for g in answer.grants], keep=ask.keep),
        )

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        ttl = self.ctx.settings.lease_ttl_s
        await every(ttl / 3, stop, lambda: self._hold_lease(ttl))

    async def _hold_lease(self, ttl: float) -> None:
        async with self.ctx.pool.acquire() as conn:
            if self.epoch is not None and await repo.renew_lease(
                conn, self.holder, self.epoch, ttl
            ):
                return
            if self.epoch is not None:
                log.warning("lost the placer lease", extra=kv(epoch=self.epoch))
                self.epoch = None
            epoch = await repo.acquire_lease(conn, self.holder, ttl)
            if epoch is not None:
                self.epoch = epoch
                self._reasons = {}  # another leader may have written since
                self._ends = {}
                log.info("leading", extra=kv(holder=self.holder, epoch=epoch))
                self.wake()

    async def _cycle_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await woken(self._wake, stop, self.ctx.settings.cycle_interval_s)
            self._wake.clear()
            if self.epoch is not None and not stop.is_set():
                await self.cycle()

    async def cycle(self) -> Plan | None:
        """One scheduling pass; returns the plan it applied, or None when not leading."""
        epoch = self.epoch
        if epoch is None:
            return None
        started = datetime.now(UTC)
        now = started.timestamp()  # the one clock reading of this transaction
        t0 = time.perf_counter()
        woken, self._woken_at = self._woken_at, None
        with tracer.start_as_current_span("placer.cycle") as span:
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if not await repo.lock_lease(conn, self.holder, epoch, self._idle_s):
                    # Deposed (paused or cut off past the lease): this cycle writes nothing.
                    log.warning("lost the placer lease", extra=kv(epoch=epoch, at="cycle"))
                    self.epoch = None
                    return None
                locked = time.perf_counter()
                await repo.release_finished(conn)
                await repo.release_dropped_nodes(conn)
                snapshot = await _load_snapshot(conn)
                pending = await _load_requests(conn, now)
                kept = await repo.load_kept(conn)
                requests = [p.request for p in pending]
                if self.policy.use_predictions:
                    requests, snapshot = await self._predicted(conn, requests, snapshot)
                plan = place_keeping(snapshot, requests, now, kept, self.policy)
                attempts = {p.request.job_id: p.attempt for p in pending}
                versions = {p.request.job_id: p.version for p in pending}
                owed = await _apply(conn, plan, attempts, versions, epoch)
                # Only what changed since this leader last wrote: 50,000 waiting jobs
                # must not mean 50,000 row writes a second.
                changed = tuple(w for w in plan.waits if self._reasons.get(w.job_id) != w)
                await repo.write_waits(conn, changed)
                ends = self._predicted_ends(snapshot, now)
                await repo.write_predictions(
                    conn, {j: e for j, e in ends.items() if self._ends.get(j) != e}
                )
                duration = time.perf_counter() - t0
                self.cycles += 1
                if plan.starts:
                    await repo.record_cycle(
                        conn, epoch, self.cycles, started, duration, len(plan.starts), len(pending)
                    )
            self._reasons = {w.job_id: w for w in plan.waits}  # committed: what the table says
            self._ends = ends
            span.set_attribute("placer.placed", len(plan.starts))
            span.set_attribute("placer.pending", len(pending))
        if owed:
            self.ctx.relay.kick(owed)
        log.info(
            "cycle",
            extra=kv(
                epoch=epoch,
                pending=len(pending),
                placed=len(plan.starts),
                preempt=len(plan.preemptions),
                ms=round(duration * 1000, 1),
                lock_ms=round((locked - t0) * 1000, 1),  # connection + lease row
                woke_ms=None if woken is None else round((t0 - woken) * 1000, 1),
            ),
        )
        return plan

    def _predicted_ends(self, snapshot: Snapshot, now: float) -> dict[int, tuple[float, str]]:
        """Each running job's predicted end and why (`muster show job`), when predicting."""
        if self._predictor is None or not self.policy.use_predictions:
            return {}
        ends = {r.job_id: explained_end(self._predictor, r, now) for r in snapshot.running}
        return {j: e for j, e in ends.items() if e is not None}

    async def _predicted(
        self, conn: Conn, requests: list[JobRequest], snapshot: Snapshot
    ) -> tuple[list[JobRequest], Snapshot]:
        """Queue and running jobs with their predicted runtimes. The predictor loads the
        job history once, then adds each job that finished (reloading it after every end
        put 35 ms of a 2,000-job history on the start right after that end)."""
        if self._predictor is None:
            self._finished.clear()  # the history loaded holds them
            predictor = Predictor(window=repo.HISTORY)
            for job_id, outcome in await repo.load_outcomes(conn):
                predictor.learn(outcome, ident=job_id)
            self._predictor = predictor
        elif self._finished:
            finished = set(self._finished)
            for job_id, outcome in await repo.outcomes_of(conn, sorted(finished)):
                self._predictor.learn(outcome, ident=job_id)  # once, if redelivered
            self._finished -= finished
        requests, running = with_predictions(self._predictor, requests, snapshot.running)
        return requests, msgspec.structs.replace(snapshot, running=running)


async def _load_snapshot(conn: Conn) -> Snapshot:
    return Snapshot(
        nodes=await repo.load_nodes(conn),
        running=await repo.load_running(conn),
        limits=await repo.load_limits(conn),
        reservations=await repo.load_reservations(conn),
    )


async def _load_requests(conn: Conn, now: float) -> list[repo.PendingJob]:
    """The queue, each job with its blocker (begin time, dependency, array throttle)
    and the fairshare service's multifactor priority, which ranks it."""
    pending = await repo.load_pending(conn)
    specs = [(p.request.job_id, p.spec) for p in pending]
    blocked = blockers(specs, await repo.load_blocker_facts(conn, specs), now)
    prio = await repo.load_priorities(conn)
    up_since = await repo.load_up_since(conn)
    return [
        msgspec.structs.replace(
            p,
            request=msgspec.structs.replace(
                p.request,
                blocked_by=blocked.get(p.request.job_id),
                priority=prio.get(p.request.job_id, p.request.priority),
                excluded_nodes=tuple(
                    sorted(
                        {
                            *p.request.excluded_nodes,
                            *standing(p.run_excluded, p.requeued_at, up_since),
                        }
                    )
                ),
            ),
        )
        for p in pending
    ]


async def _apply(
    conn: Conn, plan: Plan, attempts: dict[int, int], versions: dict[int, int], epoch: int
) -> list[OutboxRow]:
    """Write the plan's allocations and preemptions; the events they owe go in the
    outbox (its rows returned, for the relay). A start whose job's placement fields
    changed since the queue was read (`muster update -p/-N/...`) is withdrawn, and a
    preemption for such a job is not asked: the next cycle plans it by the new ones.
    The change is seen whichever commits first: an allocation's insert waits on the
    job's row an update holds, a preemption on its change lock (`hold_job_changes`)."""
    allocated: dict[int, int] = {}
    for start in plan.starts:
        allocated[start.job_id] = await repo.insert_allocation(
            conn, start, attempts[start.job_id], epoch
        )
    preempting_for = {pre.for_job_id for pre in plan.preemptions}
    await hold_job_changes(conn, preempting_for, shared=True)
    changed = await repo.changed_since(
        conn, {j: versions[j] for j in (*allocated, *preempting_for)}
    )
    for job_id in changed & allocated.keys():
        await repo.withdraw_allocation(conn, allocated[job_id])
        log.info("start withdrawn: the job was changed", extra=kv(job=job_id))
    events: list[JobAllocated | JobPreemptRequested] = []
    for start in plan.starts:
        if start.job_id in changed:
            continue
        attempt, alloc_id = attempts[start.job_id], allocated[start.job_id]
        events.append(
            JobAllocated(
                job_id=start.job_id,
                attempt=attempt,
                alloc_id=alloc_id,
                grants=tuple(Grant(node=g.node, gpus=g.gpus) for g in start.grants),
                epoch=epoch,
                backfilled=start.backfilled,
            )
        )
    for pre in plan.preemptions:
        if pre.for_job_id in changed:
            log.info("preemption not asked: its job was changed", extra=kv(job=pre.for_job_id))
            continue
        if not await repo.record_preemption(conn, pre.victim_job_id, pre.for_job_id, epoch):
            continue  # already asked: the victim is in its grace time
        events.append(
            JobPreemptRequested(
                job_id=pre.victim_job_id,
                for_job_id=pre.for_job_id,
                grace_s=pre.grace_s,
                epoch=epoch,
            )
        )
    return await outbox_add(conn, *events)


class NotLeading(NotMine):
    """Only the lease holder places: the bus hands the request back for the leader,
    without counting it as a failure (a standby must not dead-letter it)."""


def _spare_gang(ask: JobSparesRequested, alloc: repo.LiveAllocation) -> JobRequest:
    spec = alloc.spec
    cpus, mib = per_node(spec)  # a spare is as big as the node it replaces must be
    return JobRequest(
        job_id=ask.job_id,
        user=spec.user,
        account=spec.account,
        partition=spec.partition,
        qos=spec.qos,
        submitted_at=0.0,
        nodes_min=ask.count,
        nodes_max=ask.count,
        gpus_per_node=spec.gpus_per_node,
        gpu_model=spec.gpu_model,
        constraint=spec.constraint,
        exclusive=spec.exclusive,
        excluded_nodes=tuple(sorted({*spec.excluded_nodes, *ask.exclude, *alloc.nodes})),
        cpus_per_node=cpus,
        mem_per_node_mib=mib,
        mem_whole=whole_memory(spec),
        time_limit_s=spec.time_limit_s,
    )
