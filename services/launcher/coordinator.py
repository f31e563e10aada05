"""Job coordinator shell (cluster side): turns allocations into running gangs and keeps
them running through faults. Every decision is `coordinator_core.decide`'s.

One path for every event and timer: event in -> one transaction (inbox, lock the run,
load the core's state, `decide`, write the new state, the attempt history and the events
owed to the outbox) -> after the commit, the decision's actions on the node agents
(stop, signal, start the next generation, then end the run). Those actions run in order
per job, on a chain, so a later decision's stop never overtakes an earlier start.

- `job.allocated` -> start workers on every node, or on none (gang)
- `worker.exited`, `node.fault`, `node.down`, `job.cancel_requested`,
  `job.preempt_requested`, the settle / `--signal` / time-limit timers -> the core
- a run that ends after its workers are stopped stays COMPLETING (GPUs held) until they
  are gone; usage ticks while running, so long jobs are charged as they run
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from services.launcher import coordinator_core as core
from services.launcher import repo
from services.launcher.executor import free_port
from services.launcher.exitstatus import ExitStatus
from services.launcher.gang import Agents, Generation
from shared.db import Conn, inbox_first_time, outbox_add
from shared.events import (
    AnyEvent,
    Event,
    Grant,
    JobAllocated,
    JobCancelRequested,
    JobFinished,
    JobPreemptRequested,
    JobReconfigured,
    JobRequeued,
    JobSparesAnswered,
    JobSparesRequested,
    JobStarted,
    NodeDown,
    NodeFault,
    NodeRecovered,
    UsageTicked,
    WorkerExited,
)
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import ServiceContext, every, until_stopped

log = logging.getLogger(__name__)

SUBJECTS = (
    "muster.job.allocated",
    "muster.job.cancel_requested",
    "muster.job.preempt_requested",
    "muster.worker.exited",
    "muster.node.fault",
    "muster.node.down",
    "muster.job.spares_answered",
    "muster.node.recovered",
)
CONSUMER = "launcher"
LIVE = ("STARTING", "RUNNING")
_CORE_DECODER = msgspec.json.Decoder(core.JobRun)
Choose = Callable[[core.JobRun, float], core.AnyObservation | None]


class Effects(msgspec.Struct, kw_only=True):
    """What a committed decision still owes the node agents, in this order."""

    spec: JobSpec
    job_id: int
    signal: core.SignalWorkers | None = None
    stops: list[core.StopWorkers] = []
    start: Generation | None = None
    start_delay_s: float = 0.0
    end_delay_s: float | None = None  # set: end the COMPLETING run after the stops


class Coordinator:
    def __init__(self, ctx: ServiceContext, config: core.CoordinatorConfig) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.config = config
        self.agents = Agents(ctx.bus)
        self._locks: dict[int, asyncio.Lock] = {}
        self._chains: dict[int, asyncio.Task[None]] = {}
        self._timer_wake = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await self.reconcile()
        await until_stopped(stop, self._consume, self._timers, self._ticks, self.ctx.relay.run)

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    async def handle(self, event: AnyEvent) -> None:
        match event:
            case JobAllocated():
                await self.allocated(event)
            case WorkerExited():
                status = ExitStatus(
                    exit_code=event.exit_code, signal=event.signal, oom_killed=event.oom_killed
                )
                obs = core.WorkerExited(
                    node=event.node,
                    attempt=event.generation,
                    status=status,
                    spawn_failed=event.spawn_failed,
                )
                await self.observe(event.job_id, _always(obs), event)
            case NodeFault() if event.affects_job or event.excludes_node:
                await self.node_lost(event)
            case NodeDown():
                await self.node_lost(event)
            case JobCancelRequested():
                await self.cancel(event)
            case JobSparesAnswered():
                await self.observe(event.job_id, _answer(event), event)
            case NodeRecovered() if self.settings.grow_back:
                await self.offer_growth()
            case JobPreemptRequested():
                await self.observe(
                    event.job_id, _always(core.Preempt(grace_s=event.grace_s)), event
                )
            case _:
                return

    # --- events -> observations ----------------------------------------------------

    async def allocated(self, ev: JobAllocated) -> None:
        gpus = {g.node: list(g.gpus) for g in ev.grants}
        async with self._lock(ev.job_id):
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                    return
                loaded = await repo.load_spec(conn, ev.job_id)
                if loaded is None:
                    return
                spec, cancelled = loaded
                current = await repo.lock_run(conn, ev.job_id)
                if current is not None and (
                    current.attempt >= ev.attempt and current.state != "REQUEUED"
                ):
                    return
                if cancelled:
                    await self._end_unstarted(conn, spec, ev.job_id, "cancelled")
                    return
                gen = await self._start_run(conn, spec, ev, gpus, current)
            self.ctx.relay.kick()
            self._enqueue(Effects(spec=spec, job_id=ev.job_id, start=gen))

    async def _start_run(
        self,
        conn: Conn,
        spec: JobSpec,
        ev: JobAllocated,
        gpus: dict[str, list[int]],
        current: repo.Run | None,
    ) -> Generation:
        count = current.restart_count if current else 0
        excluded = current.excluded if current else ()
        requeued = current is not None and current.state == "REQUEUED"
        reason = f"after requeue: {current.reason}" if current and requeued else ""
        row = await repo.start_run(
            conn,
            (ev.job_id, ev.attempt),
            gpus,
            restart_count=count,
            excluded=excluded,
            reason=reason,
        )
        state = core.start_run(
            spec, job_id=ev.job_id, nodes=row.nodes, now=time.time(), attempt=count,
            restart_count=count, excluded_nodes=excluded,
        )  # fmt: skip
        before = _load_core(current, spec)
        if before is not None:  # the restart limit spans requeues
            state = msgspec.structs.replace(state, fault_restarts=before.fault_restarts)
        await self._save_core(conn, state)
        return Generation(
            job_id=ev.job_id, attempt=ev.attempt, restart_count=count, nodes=row.nodes, gpus=gpus
        )

    async def node_lost(self, ev: NodeFault | NodeDown) -> None:
        async with self.ctx.pool.acquire() as conn:
            jobs = await repo.runs_on_node(conn, ev.node)
        obs: core.AnyObservation
        if isinstance(ev, NodeFault):
            if ev.job_id is not None and not ev.excludes_node:
                jobs = [j for j in jobs if j == ev.job_id]
            why = f"xid {ev.xid} ({ev.fault_class})" if ev.xid is not None else ev.fault_class
            obs = core.NodeFault(node=ev.node, reason=why, excludes_node=ev.excludes_node)
        else:
            obs = core.NodeDown(node=ev.node, reason=ev.reason)
        await asyncio.gather(*(self.observe(job, _always(obs), ev) for job in jobs))

    async def offer_growth(self) -> None:
        """A node came back: elastic jobs below their maximum ask the placer for room
        (MUSTER_GROW_BACK; a grow restarts the job at its next checkpoint)."""
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            asks = [
                JobSparesRequested(
                    job_id=run.job_id,
                    attempt=run.attempt,
                    count=spec.nodes_max - len(run.nodes),
                    keep=run.nodes,
                )
                for run, spec in await repo.shrunk_elastic_runs(conn)
            ]
            await outbox_add(conn, *asks)
        if asks:
            self.ctx.relay.kick()

    async def cancel(self, ev: JobCancelRequested) -> None:
        if ev.signal:  # `muster cancel --signal`: signal the workers, cancel nothing
            await self._signal_only(ev)
            return
        async with self._lock(ev.job_id):
            fx: Effects | None = None
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                    return
                run = await repo.lock_run(conn, ev.job_id)
                loaded = await repo.load_spec(conn, ev.job_id)
                if loaded is None:
                    return
                spec = loaded[0]
                if run is None or run.state == "PENDING":
                    await self._end_unstarted(conn, spec, ev.job_id, ev.reason)
                elif run.state == "REQUEUED":
                    await self._end(conn, spec, run, _ending(run, "CANCELLED", ev.reason))
                elif run.state in LIVE:
                    fx = await self._decide(conn, spec, run, _always(core.Cancel(reason=ev.reason)))
            self.ctx.relay.kick()
            if fx is not None:
                self._enqueue(fx)

    async def _signal_only(self, ev: JobCancelRequested) -> None:
        sig = core.parse_signal(ev.signal or "")
        async with self.ctx.pool.acquire() as conn:
            run = await repo.lock_run(conn, ev.job_id)
        if sig is not None and run is not None and run.state in LIVE:
            await self.agents.signal(ev.job_id, run.nodes, sig, leader_only=False)

    # --- one decision ----------------------------------------------------------------

    async def observe(self, job_id: int, choose: Choose, event: Event | None = None) -> None:
        """Event (or timer) in -> one transaction -> core -> state + outbox -> effects."""
        async with self._lock(job_id):
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if event is not None and not await inbox_first_time(
                    conn, f"{CONSUMER}:{job_id}", event.event_id
                ):
                    return
                if isinstance(event, WorkerExited):
                    await repo.record_exit(
                        conn, job_id, event.attempt, event.generation, event.node,
                        event.exit_code, event.signal,
                    )  # fmt: skip
                if isinstance(event, JobSparesAnswered) and event.grants:
                    await repo.add_gpus(conn, job_id, {g.node: list(g.gpus) for g in event.grants})
                run = await repo.lock_run(conn, job_id)
                loaded = await repo.load_spec(conn, job_id)
                if run is None or loaded is None or run.state not in LIVE:
                    return
                fx = await self._decide(conn, loaded[0], run, choose)
            self.ctx.relay.kick()
            if fx is not None:
                self._enqueue(fx)

    async def _decide(
        self, conn: Conn, spec: JobSpec, run: repo.Run, choose: Choose
    ) -> Effects | None:
        before = _load_core(run, spec)
        now = time.time()
        obs = None if before is None else choose(before, now)
        if before is None or obs is None:
            return None
        decision = core.decide(before, obs, self.config, now)
        if decision.verdict is core.Verdict.IGNORE:
            return None
        log.debug("decided", extra=kv(job=run.job_id, obs=type(obs).__name__, v=decision.verdict))
        return await self._apply(conn, spec, run, before, decision)

    async def _apply(
        self, conn: Conn, spec: JobSpec, run: repo.Run, before: core.JobRun, decision: core.Decision
    ) -> Effects:
        """Write what the decision makes true; return what it owes the agents."""
        after = decision.run
        for rec in after.history[len(before.history) :]:
            closed = (rec.nodes, rec.world_size, _at(rec.started_at), _at(rec.ended_at))
            outcome = f"{rec.verdict}: {rec.reason}"
            await repo.close_attempt(conn, (run.job_id, run.attempt), rec.attempt, closed, outcome)
        fx = Effects(spec=spec, job_id=run.job_id)
        for action in decision.actions:
            match action:
                case core.SignalWorkers():
                    fx.signal = action
                case core.StopWorkers():
                    fx.stops.append(action)
                case core.StartAttempt():
                    fx.start = await self._restart(conn, run, action, decision)
                    fx.start_delay_s = action.delay_s
                case core.Requeue() | core.Finish():
                    end = _decided_ending(action, after)
                    if any(s.nodes for s in fx.stops):
                        await repo.begin_stopping(conn, run.job_id, end)
                        fx.end_delay_s = action.delay_s if isinstance(action, core.Requeue) else 0
                    else:
                        await self._end(conn, spec, run, end)
                case core.RequestSpares():  # the placer answers with job.spares_answered
                    ask = JobSparesRequested(
                        job_id=run.job_id,
                        attempt=run.attempt,
                        count=action.count,
                        keep=action.keep,
                        exclude=action.exclude,
                    )
                    await outbox_add(conn, ask)
        await self._save_core(conn, after)
        return fx

    async def _restart(
        self, conn: Conn, run: repo.Run, start: core.StartAttempt, decision: core.Decision
    ) -> Generation:
        """The next generation on `start.nodes` (shrink): the placer frees the rest."""
        gpus = {n: run.gpus[n] for n in start.nodes if n in run.gpus}
        why = decision.run.history[-1].reason if decision.run.history else ""
        reason = f"{decision.verdict}: {why}"
        await repo.reshape(
            conn, run, gpus, restart_count=start.restart_count, world_size=len(gpus),
            reason=reason, now=_at(time.time()),
        )  # fmt: skip
        dropped = tuple(n for n in run.nodes if n not in gpus)
        await outbox_add(
            conn,
            JobReconfigured(
                job_id=run.job_id,
                attempt=run.attempt,
                grants=tuple(Grant(node=n, gpus=tuple(g)) for n, g in gpus.items()),
                dropped_nodes=dropped,
                world_size=len(gpus),
                reason=why,
            ),
        )
        return Generation(
            job_id=run.job_id, attempt=run.attempt, restart_count=start.restart_count,
            nodes=tuple(gpus), gpus=gpus,
        )  # fmt: skip

    async def _save_core(self, conn: Conn, state: core.JobRun) -> None:
        due = _due_at(state)
        await repo.save_core(conn, state.job_id, msgspec.json.encode(state), due)
        if due is not None:
            delay = max(0.0, due - time.time())
            asyncio.get_running_loop().call_later(delay, self._timer_wake.set)

    # --- effects on the agents, in order per job -------------------------------------

    def _enqueue(self, fx: Effects) -> None:
        previous = self._chains.get(fx.job_id)
        task = asyncio.create_task(self._carry_out(fx, previous))
        self._chains[fx.job_id] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._chains.get(fx.job_id) is t:
                del self._chains[fx.job_id]
            if not t.cancelled() and t.exception() is not None:
                log.error("job effects failed", extra=kv(job=fx.job_id, error=repr(t.exception())))

        task.add_done_callback(done)

    async def _carry_out(self, fx: Effects, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        if fx.signal is not None:
            s = fx.signal
            await self.agents.signal(fx.job_id, s.nodes, s.signal, leader_only=s.leader_only)
        await asyncio.gather(*(self.agents.stop(fx.job_id, s.nodes, s.grace_s) for s in fx.stops))
        if fx.start is not None:
            if fx.start_delay_s > 0:
                await asyncio.sleep(fx.start_delay_s)
            await self.launch(fx.spec, fx.start)
        if fx.end_delay_s is not None:
            if fx.end_delay_s > 0:  # a requeue's backoff: the GPUs stay held meanwhile
                await asyncio.sleep(fx.end_delay_s)
            await self._end_stopped(fx.job_id)

    async def launch(self, spec: JobSpec, gen: Generation) -> None:
        """Start one generation on every node of `gen`, or on none (the core stops the
        ones that started and requeues)."""
        async with self.ctx.pool.acquire() as conn:
            addresses = await repo.node_addresses(conn, list(gen.nodes))
        master = addresses.get(gen.nodes[0], "127.0.0.1")
        replies = await self.agents.start(spec, gen, master, free_port())
        failed = {n: r.message for n, r in replies.items() if not r.ok}
        if failed:
            obs = core.StartFailed(
                attempt=gen.restart_count, nodes=tuple(failed), reason="; ".join(failed.values())
            )
            await self.observe(gen.job_id, _always(obs))
            return
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            current = await repo.lock_run(conn, gen.job_id)
            if current is None or current.state != "STARTING":
                return  # superseded while starting: a later decision stops these
            if (current.attempt, current.restart_count) != (gen.attempt, gen.restart_count):
                return
            await repo.mark_running(conn, current, _at(time.time()))
            started = JobStarted(
                job_id=gen.job_id, attempt=gen.attempt, nodes=gen.nodes, world_size=len(gen.nodes)
            )
            await outbox_add(conn, started)
        self.ctx.relay.kick()
        log.info("launched", extra=kv(job=gen.job_id, nodes=gen.nodes, gen=gen.restart_count))

    async def _end_stopped(self, job_id: int) -> None:
        """The workers of a COMPLETING run are gone (or their node is): end it."""
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            run = await repo.lock_run(conn, job_id)
            loaded = await repo.load_spec(conn, job_id)
            if run is None or loaded is None or run.state != "COMPLETING":
                return
            await self._end(conn, loaded[0], run, repo.ending_of(run))
        self.ctx.relay.kick()

    # --- endings ---------------------------------------------------------------------

    async def _end(self, conn: Conn, spec: JobSpec, run: repo.Run, end: repo.Ending) -> None:
        now = datetime.now(UTC)
        used = await repo.finish(conn, run, end, now)
        model = await repo.gpu_model(conn, list(run.nodes))
        if end.state == "REQUEUED":
            requeued = JobRequeued(
                job_id=run.job_id, attempt=run.attempt, reason=end.reason,
                excluded_nodes=end.excluded, restart_count=end.restart_count, gpu_seconds=used,
                user=spec.user, account=spec.account,
            )  # fmt: skip
            tick = UsageTicked(
                job_id=run.job_id, attempt=run.attempt, user=spec.user, account=spec.account,
                gpu_model=model, gpu_seconds_total=used,
            )  # fmt: skip
            await outbox_add(conn, requeued, tick)
        else:
            finished = JobFinished(
                job_id=run.job_id, attempt=run.attempt, state=end.state, user=spec.user,
                account=spec.account, reason=end.reason, exit_code=end.exit_code,
                signal=end.signal, gpu_seconds=used, gpu_model=model,
                started_at=run.started_at, ended_at=now,
            )  # fmt: skip
            await outbox_add(conn, finished)
        log.info("job ended", extra=kv(job=run.job_id, state=end.state, reason=end.reason))

    async def _end_unstarted(self, conn: Conn, spec: JobSpec, job_id: int, reason: str) -> None:
        await repo.finish_unstarted(conn, job_id, "CANCELLED", reason, datetime.now(UTC))
        finished = JobFinished(
            job_id=job_id, attempt=0, state="CANCELLED", user=spec.user, account=spec.account,
            reason=reason,
        )  # fmt: skip
        await outbox_add(conn, finished)

    # --- timers, usage, reconcile ----------------------------------------------------

    async def _timers(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._timer_wake.clear()
            wait_s = 1.0
            try:
                wait_s = await self.check_timers()
            except (TimeoutError, OSError, RuntimeError) as err:
                log.warning("timer pass failed", extra=kv(error=repr(err)))
            waits = [
                asyncio.ensure_future(self._timer_wake.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            _, pending = await asyncio.wait(
                waits, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()

    async def check_timers(self) -> float:
        """Deliver the due timers; returns how long until the next one (at most 1 s)."""
        async with self.ctx.pool.acquire() as conn:
            due, later = await repo.due(conn)
            stuck = await repo.stuck_stopping(conn, self._stuck_after_s())
        await asyncio.gather(*(self.observe(job_id, _due_observation) for job_id in due))
        for job_id in stuck:
            if job_id not in self._chains:  # not still stopping in this process
                await self._end_stopped(job_id)
        return 1.0 if later is None else min(1.0, max(0.01, later - time.time()))

    def _stuck_after_s(self) -> float:
        return self.config.kill_wait_s + self.config.backoff_max_s + 15.0

    async def _ticks(self, stop: asyncio.Event) -> None:
        await every(self.settings.usage_tick_s, stop, self.tick_usage)

    async def tick_usage(self) -> None:
        """Charge running jobs as they run; fairshare takes differences, so a repeated
        or reordered tick is harmless."""
        now = datetime.now(UTC)
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            runs = [r for r in await repo.active_runs(conn) if r.state == "RUNNING"]
            ticks = []
            for run in runs:
                loaded = await repo.load_spec(conn, run.job_id)
                if loaded is None:
                    continue
                ticks.append(
                    UsageTicked(
                        job_id=run.job_id,
                        attempt=run.attempt,
                        user=loaded[0].user,
                        account=loaded[0].account,
                        gpu_model=await repo.gpu_model(conn, list(run.nodes)),
                        gpu_seconds_total=run.used_gpu_seconds(now),
                    )
                )
            await outbox_add(conn, *ticks)
        if ticks:
            self.ctx.relay.kick()

    async def reconcile(self) -> None:
        """On start: relaunch generations whose start was interrupted (the agents treat a
        repeated start of the same generation as done) and finish interrupted stops."""
        async with self.ctx.pool.acquire() as conn:
            runs = [r for r in await repo.active_runs(conn) if r.state != "RUNNING"]
            specs = {r.job_id: await repo.load_spec(conn, r.job_id) for r in runs}
        for run in runs:
            loaded = specs[run.job_id]
            if loaded is None:
                continue
            fx = Effects(spec=loaded[0], job_id=run.job_id)
            if run.state == "STARTING":
                fx.start = Generation(
                    job_id=run.job_id, attempt=run.attempt, restart_count=run.restart_count,
                    nodes=run.nodes, gpus=run.gpus,
                )  # fmt: skip
            else:
                fx.stops = [core.StopWorkers(nodes=run.nodes, grace_s=self.config.kill_wait_s)]
                fx.end_delay_s = 0.0
            self._enqueue(fx)

    def _lock(self, job_id: int) -> asyncio.Lock:
        if len(self._locks) > 10_000:  # forget idle jobs' locks
            self._locks = {j: k for j, k in self._locks.items() if k.locked()}
        return self._locks.setdefault(job_id, asyncio.Lock())


# --- pure helpers ----------------------------------------------------------------------


def _always(obs: core.AnyObservation) -> Choose:
    return lambda _run, _now: obs


def _answer(ev: JobSparesAnswered) -> Choose:
    """The placer's answer is spares for a job waiting on them, or room to grow back
    for a running elastic job."""
    nodes = tuple(g.node for g in ev.grants)

    def choose(run: core.JobRun, _now: float) -> core.AnyObservation:
        if run.phase is core.Phase.AWAITING_SPARE:
            return core.SparesGranted(nodes=nodes) if nodes else core.SparesDenied()
        return core.NodesAvailable(nodes=nodes)

    return choose


def _due_observation(run: core.JobRun, now: float) -> core.AnyObservation | None:
    """The timer of `run` that is due, the most consequential first."""
    t = core.timers(run)
    if t.spare_deadline is not None and t.spare_deadline <= now:
        return core.SparesDenied()
    if t.settle_at is not None and t.settle_at <= now:
        return core.SettleElapsed()
    if t.limit_at <= now:
        return core.TimeLimitReached()
    if t.signal_at is not None and t.signal_at <= now:
        return core.SignalDue()
    return None


def _due_at(run: core.JobRun) -> float | None:
    if run.phase is core.Phase.ENDED:
        return None
    t = core.timers(run)
    if run.phase is core.Phase.AWAITING_SPARE:
        return t.spare_deadline
    signal_at = t.signal_at if core.parse_signal(run.spec.signal or "") is not None else None
    return min(x for x in (signal_at, t.limit_at, t.settle_at) if x is not None)


def _load_core(run: repo.Run | None, spec: JobSpec) -> core.JobRun | None:
    if run is None or run.core is None:
        return None
    return msgspec.structs.replace(_CORE_DECODER.decode(run.core), spec=spec)


def _decided_ending(action: core.Requeue | core.Finish, after: core.JobRun) -> repo.Ending:
    if isinstance(action, core.Requeue):
        return repo.Ending(
            state="REQUEUED", reason=action.reason, restart_count=action.restart_count,
            excluded=action.excluded_nodes,
        )  # fmt: skip
    return repo.Ending(
        state=str(action.state), reason=action.reason, exit_code=action.exit_code,
        signal=action.signal, restart_count=after.restart_count, excluded=after.excluded_nodes,
    )  # fmt: skip


def _ending(run: repo.Run, state: str, reason: str) -> repo.Ending:
    return repo.Ending(
        state=state, reason=reason, restart_count=run.restart_count, excluded=run.excluded
    )


def _at(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)
