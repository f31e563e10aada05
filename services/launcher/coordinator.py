"""Job coordinator shell (cluster side): routing and transactions. Turns allocations
into running gangs and keeps them running through faults; every decision is
`coordinator_core.decide`'s.

One path for every event and timer: event in -> one transaction (inbox, lock the run,
load the core's state, `decide`, write the new state, the attempt history and the events
owed to the outbox) -> after the commit, the decision's actions on the node agents,
carried out in order per job by `effects.EffectRunner`. The timers, usage ticks and the
reconcile are in `upkeep.py`, the answer to a re-registering node in `cleaning.py`.

- `job.allocated` -> start the allocation's ROW (the placer's) on every node, or none
- `worker.exited`, `job.node_lost` (a step's task fenced or lost with its node: the
  launcher's own, docs/steps.md), `node.fault`, `node.down`, `job.cancel_requested`,
  `job.preempt_requested`, `job.requeue_requested`, `job.limit_changed` (the time
  limit updated: the timers re-armed), the settle / `--signal` / time-limit timers ->
  the core
- a run that ends after its workers are stopped stays COMPLETING (GPUs held) until they
  are gone; usage ticks while running, so long jobs are charged as they run
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import msgspec

from services.launcher import coordinator_core as core
from services.launcher import repo, repo_upkeep
from services.launcher.cleaning import Cleaner
from services.launcher.driver import Check
from services.launcher.effects import EffectRunner, Effects
from services.launcher.endings import decided_ending, end_run, end_unstarted, ending
from services.launcher.gang import Agents, Generation, launcher_signer
from services.launcher.observations import (
    Choose,
    always,
    answer,
    at,
    exited,
    load_core,
    lost,
    step_lost,
)
from services.launcher.owners import Owners
from services.launcher.owners_core import shard_of
from services.launcher.reconcile_core import AllocationRow, may_start
from services.launcher.rendezvous import Rendezvous
from services.launcher.steps import StepService
from services.launcher.upkeep import Upkeep
from shared.db import Conn, inbox_first_time, outbox_add
from shared.events import (
    AnyEvent,
    Event,
    Grant,
    JobAllocated,
    JobCancelRequested,
    JobLimitChanged,
    JobNodeLost,
    JobPreemptRequested,
    JobReconfigured,
    JobRequeueRequested,
    JobSparesAnswered,
    JobSparesRequested,
    JobStarted,
    NodeDown,
    NodeFault,
    NodeRecovered,
    WorkerExited,
)
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import ServiceContext, until_stopped
from shared.settings import LauncherSettings
from shared.states import JobState

log = logging.getLogger(__name__)

SUBJECTS = (
    "muster.job.allocated",
    "muster.job.cancel_requested",
    "muster.job.limit_changed",
    "muster.job.preempt_requested",
    "muster.job.requeue_requested",
    "muster.worker.exited.>",
    "muster.job.node_lost",
    "muster.node.fault",
    "muster.node.down",
    "muster.job.spares_answered",
    "muster.node.recovered",
)
CONSUMER = "launcher"
LIVE = (JobState.STARTING, JobState.RUNNING)


class Coordinator:
    def __init__(
        self,
        ctx: ServiceContext[LauncherSettings],
        config: core.CoordinatorConfig,
        *,
        lease_s: float = 2.0,
    ) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.config = config
        signer = launcher_signer(ctx.settings.state_dir, ctx.settings.launcher_key_file)
        self.agents = Agents(ctx.bus, signer=signer)
        self.owners = Owners(ctx.settings.instance, lease_s)
        self.rendezvous = Rendezvous(ctx.pool, self.agents)
        self.effects = EffectRunner(self.agents, self.launch, self.end_stopped, self.owns)
        self.upkeep = Upkeep(self)
        self.cleaner = Cleaner(self, retry_s=self.upkeep.reconcile_s)
        # srun inside running jobs (steps.py): a step's coordinator is named as its shards'
        self.steps = StepService(ctx, self.agents, self.owners.holder, lease_s)
        self._locks: dict[int, asyncio.Lock] = {}

    async def run(self, stop: asyncio.Event) -> None:
        try:  # the reconcile loop's first pass is the reconcile on start
            await until_stopped(
                stop, self._consume, self.cleaner.consume, self.cleaner.retry_loop,
                self.upkeep.timers, self.upkeep.ticks, self.upkeep.reconcile_loop,
                self.upkeep.hold_loop, self.upkeep.mailbox_loop, self.ctx.relay.run,
                self.steps.serve, self.ctx.pruner.run,
            )  # fmt: skip
        finally:
            await self.effects.close(self.settings.drain_timeout_s)
            await self.upkeep.hand_over()

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    async def handle(self, event: AnyEvent) -> None:
        match event:
            case NodeFault() if event.affects_job or event.excludes_node:
                await self.node_lost(event)
            case NodeDown():
                await self.node_lost(event)
            case NodeRecovered() if self.settings.grow_back:
                await self.offer_growth()
            case JobAllocated() | WorkerExited() | JobCancelRequested() | JobNodeLost():
                await self.dispatch(event.job_id, event)
            case (
                JobSparesAnswered()
                | JobPreemptRequested()
                | JobRequeueRequested()
                | JobLimitChanged()
            ):
                await self.dispatch(event.job_id, event)
            case _:
                return

    async def dispatch(self, job_id: int, event: AnyEvent) -> None:
        """One job's share of an event; the owner acts on it, any other replica parks
        it in the mailbox for the owner (`park_unless_mine`)."""
        match event:
            case JobAllocated():
                await self.start_allocation(event.job_id, event.attempt, event)
            case WorkerExited():
                await self.observe(event.job_id, always(exited(event)), event)
            case JobNodeLost():
                await self.observe(event.job_id, always(step_lost(event)), event)
            case NodeFault() | NodeDown():
                await self.observe(job_id, always(lost(event)), event)
            case JobCancelRequested():
                await self.cancel(event)
            case JobSparesAnswered():
                await self.observe(event.job_id, answer(event), event)
            case JobPreemptRequested():
                await self.observe(event.job_id, always(core.Preempt(grace_s=event.grace_s)), event)
            case JobRequeueRequested():
                await self.observe(
                    event.job_id, always(core.RequeueAsked(reason=event.reason)), event
                )
            case JobLimitChanged():  # the new limit is in the spec `observe` reads
                await self.observe(event.job_id, core.due_or_rearm, event)
            case _:
                return

    # --- starts: the event path and the reconcile share this one ---------------------

    async def start_allocation(self, job_id: int, attempt: int, event: Event | None) -> None:
        """Start allocation `attempt` of `job_id` from its row, if it is live and the
        job has no run of it yet (the business key; the inbox spares a repeat). A new
        allocation's rendezvous is asked meanwhile (rendezvous.py)."""
        async with self.lock(job_id):
            nodes = tuple(g.node for g in event.grants) if isinstance(event, JobAllocated) else ()
            (spec, gen), meeting = await asyncio.gather(
                self._begin(job_id, attempt, event), self.rendezvous.early(nodes)
            )
            self.ctx.relay.kick()
            if spec is not None and gen is not None:
                self.rendezvous.keep(gen, meeting)
                self.effects.enqueue(Effects(spec=spec, job_id=job_id, start=gen))

    async def _begin(
        self, job_id: int, attempt: int, event: Event | None
    ) -> tuple[JobSpec | None, Generation | None]:
        """The start's transaction: the run STARTING (or the job ended, if cancelled)."""
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await self.park_unless_mine(conn, job_id, event):
                return None, None
            if event is not None and not await inbox_first_time(conn, CONSUMER, event.event_id):
                return None, None
            alloc = await repo_upkeep.live_allocation(conn, job_id, attempt)
            loaded = await repo.load_spec(conn, job_id)
            current = await repo.lock_run(conn, job_id)
            if alloc is None or loaded is None or not may_start(attempt, repo.key_of(current)):
                return None, None
            spec, cancelled = loaded
            now = time.time()
            if cancelled:
                await end_unstarted(conn, spec, job_id, "cancelled", at(now))
                return spec, None
            return spec, await self._start_run(conn, spec, alloc, current, now)

    async def _start_run(
        self, conn: Conn, spec: JobSpec, alloc: AllocationRow, current: repo.Run | None,
        now: float,
    ) -> Generation | None:  # fmt: skip
        count = current.restart_count if current else 0
        excluded = current.excluded if current else ()
        state = core.start_run(
            spec, job_id=alloc.job_id, nodes=tuple(alloc.gpus), now=now, generation=count,
            restart_count=count, excluded_nodes=excluded,
        )  # fmt: skip
        before = load_core(current, spec)
        if before is not None:  # the restart limit spans requeues
            state = msgspec.structs.replace(state, fault_restarts=before.fault_restarts)
        due = core.due_at(state)
        row = await repo.start_run(
            conn, (alloc.job_id, alloc.attempt), alloc.gpus, restart_count=count,
            excluded=excluded, reason=f"after requeue: {current.reason}" if current else "",
            core=(msgspec.json.encode(state), due),
        )  # fmt: skip
        if row is None:
            return None
        if due is not None:
            self.upkeep.wake_at(max(0.0, due - now))
        return Generation(
            job_id=alloc.job_id, attempt=alloc.attempt, generation=count, nodes=row.nodes,
            gpus=alloc.gpus,
        )  # fmt: skip

    # --- events -> observations ----------------------------------------------------

    async def node_lost(self, ev: NodeFault | NodeDown) -> None:
        async with self.ctx.pool.acquire() as conn:
            jobs = await repo.runs_on_node(conn, ev.node)
        if isinstance(ev, NodeFault) and ev.job_id is not None and not ev.excludes_node:
            jobs = [j for j in jobs if j == ev.job_id]
        await asyncio.gather(*(self.dispatch(job, ev) for job in jobs))

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
                if self.owns(run.job_id)
            ]
            await outbox_add(conn, *asks)
        if asks:
            self.ctx.relay.kick()

    async def cancel(self, ev: JobCancelRequested) -> None:
        if ev.signal:  # `muster cancel --signal`: signal the workers, cancel nothing
            await self._signal_only(ev)
            return
        async with self.lock(ev.job_id):
            fx: Effects | None = None
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if not await self.park_unless_mine(conn, ev.job_id, ev):
                    return
                if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                    return
                run = await repo.lock_run(conn, ev.job_id)
                loaded = await repo.load_spec(conn, ev.job_id)
                if loaded is None:
                    return
                spec, now = loaded[0], time.time()
                if run is None:
                    await end_unstarted(conn, spec, ev.job_id, ev.reason, at(now))
                elif run.state == JobState.REQUEUED:
                    end = ending(run, JobState.CANCELLED, ev.reason)
                    await end_run(conn, spec, run, end, at(now))
                elif run.state in LIVE:
                    cancel = always(core.Cancel(reason=ev.reason, exit_code=ev.exit_code))
                    fx = await self._decide(conn, spec, run, cancel, now)
            self.ctx.relay.kick()
            if fx is not None:
                self.effects.enqueue(fx)

    async def _signal_only(self, ev: JobCancelRequested) -> None:
        sig = core.parse_signal(ev.signal or "")
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await self.park_unless_mine(conn, ev.job_id, ev):
                return
            run = await repo.lock_run(conn, ev.job_id)
            loaded = await repo.load_spec(conn, ev.job_id)
        if sig is not None and run is not None and loaded is not None and run.state in LIVE:
            for act in core.signal_targets(loaded[0], run.nodes, sig, ev.signal_scope):
                await self.agents.signal(ev.job_id, act)

    # --- one decision ----------------------------------------------------------------

    async def observe(
        self, job_id: int, choose: Choose, event: Event | None = None, check: Check | None = None
    ) -> None:
        """Event (or timer) in -> one transaction -> core -> state + outbox -> effects.
        `check` (the reconcile's) re-asks, under the run's lock, whether to go on."""
        async with self.lock(job_id):
            async with self.ctx.pool.acquire() as conn, conn.transaction():
                if not await self.park_unless_mine(conn, job_id, event):
                    return
                if event is not None and not await inbox_first_time(
                    conn, f"{CONSUMER}:{job_id}", event.event_id
                ):
                    return
                if isinstance(event, WorkerExited):
                    await repo.record_exit(
                        conn, job_id, event.attempt, event.generation, event.node,
                        event.exit_code, event.signal, event.mem_peak_bytes, event.cpu_usec,
                    )  # fmt: skip
                if isinstance(event, JobSparesAnswered) and event.grants:
                    await repo.add_gpus(conn, job_id, {g.node: list(g.gpus) for g in event.grants})
                run = await repo.lock_run(conn, job_id)
                loaded = await repo.load_spec(conn, job_id)
                if run is None or loaded is None or run.state not in LIVE:
                    return
                if check is not None and not await check(conn, run):
                    return
                if isinstance(event, WorkerExited) and run.state == JobState.STARTING:
                    run = await self._started_by_exit(conn, run, loaded[0], event)
                fx = await self._decide(conn, loaded[0], run, choose, time.time())
            self.ctx.relay.kick()
            if fx is not None:
                self.effects.enqueue(fx)

    async def settle_orphan(self, job_id: int) -> None:
        """A live run whose allocation the placer released: the core stops it."""

        async def gone(conn: Conn, run: repo.Run) -> bool:
            return not await repo_upkeep.allocation_is_live(conn, job_id, run.attempt)

        await self.observe(job_id, always(core.AllocationGone()), check=gone)

    async def _decide(
        self, conn: Conn, spec: JobSpec, run: repo.Run, choose: Choose, now: float
    ) -> Effects | None:
        before = load_core(run, spec)
        obs = None if before is None else choose(before, now)
        if before is None or obs is None:
            return None
        decision = core.decide(before, obs, self.config, now)
        if decision.verdict is core.Verdict.IGNORE:
            return None
        log.debug("decided", extra=kv(job=run.job_id, obs=type(obs).__name__, v=decision.verdict))
        return await self._apply(conn, spec, run, (before, decision), now)

    async def _apply(
        self, conn: Conn, spec: JobSpec, run: repo.Run,
        decided: tuple[core.JobRun, core.Decision], now: float,
    ) -> Effects:  # fmt: skip
        """Write what the decision makes true; return what it owes the agents."""
        before, decision = decided
        after = decision.run
        for rec in after.history[len(before.history) :]:
            closed = (rec.nodes, rec.world_size, at(rec.started_at), at(rec.ended_at))
            outcome = f"{rec.verdict}: {rec.reason}"
            await repo.close_attempt(
                conn, (run.job_id, run.attempt), rec.generation, closed, outcome
            )
        fx = Effects(spec=spec, job_id=run.job_id, stop_key=(run.attempt, before.generation))
        for action in decision.actions:
            match action:
                case core.SignalWorkers():
                    fx.signals.append(action)
                case core.StopWorkers():
                    fx.stops.append(action)
                case core.StartGeneration():
                    fx.start = await self._restart(conn, run, action, decision, now)
                    fx.start_delay_s = action.delay_s
                case core.Requeue() | core.Finish():
                    end = decided_ending(action, after)
                    if fx.holds_gpus():
                        await repo.begin_stopping(conn, run.job_id, end)
                        fx.end_delay_s = action.delay_s if isinstance(action, core.Requeue) else 0
                    else:
                        await end_run(conn, spec, run, end, at(now))
                case core.RequestSpares():  # the placer answers with job.spares_answered
                    ask = JobSparesRequested(
                        job_id=run.job_id, attempt=run.attempt, count=action.count,
                        keep=action.keep, exclude=action.exclude,
                    )  # fmt: skip
                    await outbox_add(conn, ask)
        delay_s = max(fx.start_delay_s, fx.end_delay_s or 0.0)
        if delay_s > 0:  # persisted: a new owner resumes the backoff, not restarts it
            await repo.resume_in(conn, run.job_id, delay_s)
        await self._save_core(conn, after, now)
        return fx

    async def _restart(
        self, conn: Conn, run: repo.Run, start: core.StartGeneration, decision: core.Decision,
        now: float,
    ) -> Generation:  # fmt: skip
        """The next generation on `start.nodes` (shrink): the placer frees the rest."""
        gpus = {n: run.gpus[n] for n in start.nodes if n in run.gpus}
        why = decision.run.history[-1].reason if decision.run.history else ""
        await repo.reshape(
            conn, run, gpus, restart_count=start.restart_count, world_size=len(gpus),
            reason=f"{decision.verdict}: {why}", now=at(now),
        )  # fmt: skip
        dropped = tuple(n for n in run.nodes if n not in gpus)
        grants = tuple(Grant(node=n, gpus=tuple(g)) for n, g in gpus.items())
        reconfigured = JobReconfigured(
            job_id=run.job_id, attempt=run.attempt, grants=grants, dropped_nodes=dropped,
            world_size=len(gpus), reason=why,
        )  # fmt: skip
        await outbox_add(conn, reconfigured)
        return Generation(
            job_id=run.job_id, attempt=run.attempt, generation=start.generation,
            nodes=tuple(gpus), gpus=gpus,
        )  # fmt: skip

    async def _save_core(self, conn: Conn, state: core.JobRun, now: float) -> None:
        due = core.due_at(state)
        await repo.save_core(conn, state.job_id, msgspec.json.encode(state), due)
        if due is not None:
            self.upkeep.wake_at(max(0.0, due - now))

    # --- what the effects call back ----------------------------------------------------

    async def launch(self, spec: JobSpec, gen: Generation) -> None:
        """Start one generation on every node of `gen`, or on none (the core stops the
        ones that started and requeues)."""
        early = self.rendezvous.take(gen)  # asked while the start was committed
        if not self.owns(gen.job_id):
            return  # lost the job: its new owner starts the STARTING run
        meeting = early or await self.rendezvous.ask(gen.nodes)
        port = meeting.port
        if not self.owns(gen.job_id):
            return  # lost the job meanwhile: its new owner starts the STARTING run
        if port.ok:
            replies = await self.agents.start(spec, gen, meeting.master, port.port)
        else:
            replies = {gen.nodes[0]: port}
        failed = {n: r.message for n, r in replies.items() if not r.ok}
        if failed:
            obs = core.StartFailed(
                generation=gen.generation, nodes=tuple(failed),
                reason="; ".join(failed.values()),
                unanswered=tuple(n for n in failed if not replies[n].answered),
            )  # fmt: skip
            await self.observe(gen.job_id, always(obs))
            return
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await self.owners.lock(conn, gen.job_id):
                return  # the new owner's reconcile sees the run STARTING and starts it
            current = await repo.lock_run(conn, gen.job_id)
            if current is None or current.state != JobState.STARTING:
                return  # superseded while starting: a later decision stops these
            if (current.attempt, current.restart_count) != (gen.attempt, gen.generation):
                return
            await _mark_started(conn, current, datetime.now(UTC))
        self.ctx.relay.kick()
        log.info("launched", extra=kv(job=gen.job_id, nodes=gen.nodes, gen=gen.generation))

    async def _started_by_exit(
        self, conn: Conn, run: repo.Run, spec: JobSpec, ev: WorkerExited
    ) -> repo.Run:
        """A worker of the STARTING generation exited before every agent's answer was
        recorded (a quick script): it ran, so the run started. Recorded as `launch`
        would have (RUNNING, charged from the generation's start, `job.started`) before
        the exit is decided; `launch` then finds the run no longer STARTING."""
        state = load_core(run, spec)
        current = (ev.attempt, ev.generation) == (run.attempt, run.restart_count)
        if state is None or not current or ev.spawn_failed:
            return run  # a stale worker's exit, or one that never ran
        await _mark_started(conn, run, at(state.started_at))
        log.info("started, seen by its exit", extra=kv(job=run.job_id, node=ev.node))
        return await repo.lock_run(conn, run.job_id) or run

    async def end_stopped(self, job_id: int) -> None:
        """The workers of a COMPLETING run are gone (or their node is): end it."""
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await self.owners.lock(conn, job_id):
                return  # the new owner's reconcile stops and ends it
            run = await repo.lock_run(conn, job_id)
            loaded = await repo.load_spec(conn, job_id)
            if run is None or loaded is None or run.state != JobState.COMPLETING:
                return
            await end_run(conn, loaded[0], run, repo.ending_of(run), datetime.now(UTC))
        self.ctx.relay.kick()

    async def park_unless_mine(self, conn: Conn, job_id: int, event: Event | None) -> bool:
        """True: this replica owns `job_id` (checked and held for the transaction).
        Otherwise the job's event, if any, is parked for its owner."""
        if await self.owners.lock(conn, job_id):
            return True
        if event is not None:
            await repo_upkeep.park(conn, job_id, event)
        return False

    def owns(self, job_id: int) -> bool:
        """Whether this replica may act on `job_id`'s workers now."""
        return self.owners.owns(job_id)

    def mine(self, job_ids: list[int]) -> list[int]:
        return self.owners.mine(job_ids)

    def acting_on(self, shard: int) -> bool:
        """Whether a job of `shard` is being decided or carried out here."""
        busy = [j for j, k in self._locks.items() if k.locked()] + self.effects.jobs()
        return any(shard_of(j) == shard for j in busy)

    def lock(self, job_id: int) -> asyncio.Lock:
        """The job's lock in this process: decisions and their enqueued effects in order."""
        if len(self._locks) > 10_000:  # forget idle jobs' locks
            self._locks = {j: k for j, k in self._locks.items() if k.locked()}
        return self._locks.setdefault(job_id, asyncio.Lock())


async def _mark_started(conn: Conn, run: repo.Run, when: datetime) -> None:
    """The generation's workers started: RUNNING from `when`, and `job.started` owed."""
    await repo.mark_running(conn, run, when)
    started = JobStarted(
        job_id=run.job_id, attempt=run.attempt, nodes=run.nodes, world_size=len(run.nodes)
    )
    await outbox_add(conn, started)
