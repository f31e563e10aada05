"""Shell: the coordinator's clockwork and level-triggered repairs.

- timers: `job_runs.due_at` (settle, `--signal`, time limit, spare deadline) delivered
  to the core when due;
- usage: running jobs are charged every `usage_tick_s`;
- reconcile, on start and every `reconcile_s`: from the tables, not from events
  (`reconcile_core.plan_reconcile`): start each live allocation that has no run (its
  `job.allocated` was lost), settle each live run whose allocation is gone, relaunch
  interrupted starts, finish interrupted stops, and (MUSTER_GROW_BACK) let shrunk
  elastic jobs ask for their nodes back (the nodes still owed a
  `node.cleaned` are retried on the same period by cleaning.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from services.launcher import coordinator_core as core
from services.launcher import repo, repo_upkeep
from services.launcher.driver import Driver
from services.launcher.effects import Effects
from services.launcher.gang import Generation
from services.launcher.reconcile_core import plan_reconcile
from shared.db import outbox_add
from shared.events import UsageTicked
from shared.logs import kv
from shared.runtime import every
from shared.states import JobState
from shared.transient import is_transient
from shared.waits import woken

log = logging.getLogger(__name__)

RECONCILE_S = 5.0  # how often the tables are checked for what events may have missed
# An allocation younger than this is left to its job.allocated, most likely in flight.
LOST_AFTER_S = 5.0
MAILBOX_S = 0.2  # how often the events parked for this replica's jobs are looked for


class Upkeep:
    def __init__(self, coordinator: Driver, *, reconcile_s: float = RECONCILE_S) -> None:
        self.c = coordinator
        self.reconcile_s = reconcile_s
        self._wake = asyncio.Event()
        self._sweep = asyncio.Event()  # shards were taken: reconcile now

    # --- timers --------------------------------------------------------------------

    def wake_at(self, delay_s: float) -> None:
        """A timer is due in `delay_s`: wake the timer loop then."""
        asyncio.get_running_loop().call_later(delay_s, self._wake.set)

    async def timers(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._wake.clear()
            wait_s = 1.0
            try:
                wait_s = await self.check_timers()
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("timer pass failed", extra=kv(error=repr(err)))
            await woken(self._wake, stop, wait_s)

    async def check_timers(self) -> float:
        """Deliver the due timers; returns how long until the next one (at most 1 s)."""
        async with self.c.ctx.pool.acquire() as conn:
            due, later = await repo.due(conn)
            stuck = await repo.stuck_stopping(conn, self._stuck_after_s())
        due, stuck = self.c.mine(due), self.c.mine(stuck)  # the owner's timers, resumed
        await asyncio.gather(*(self.c.observe(job_id, core.due_or_rearm) for job_id in due))
        for job_id in stuck:
            if not self.c.effects.busy(job_id):  # not still stopping in this process
                await self.c.end_stopped(job_id)
        return 1.0 if later is None else min(1.0, max(0.01, later - time.time()))

    def _stuck_after_s(self) -> float:
        config = self.c.config
        return config.kill_wait_s + config.backoff_max_s + 15.0

    # --- usage ---------------------------------------------------------------------

    async def ticks(self, stop: asyncio.Event) -> None:
        await every(self.c.settings.usage_tick_s, stop, self.tick_usage)

    async def tick_usage(self) -> None:
        """Charge running jobs as they run; fairshare takes differences, so a repeated
        or reordered tick is harmless."""
        now = datetime.now(UTC)
        async with self.c.ctx.pool.acquire() as conn, conn.transaction():
            runs = [
                r for r in await repo.active_runs(conn)
                if r.state == JobState.RUNNING and self.c.owns(r.job_id)
            ]  # fmt: skip
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
            self.c.ctx.relay.kick()

    # --- reconcile -----------------------------------------------------------------

    async def reconcile_loop(self, stop: asyncio.Event) -> None:
        """A pass every `reconcile_s`, and at once when shards were just taken."""
        while not stop.is_set():
            self._sweep.clear()
            try:
                await self.reconcile()
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("reconcile failed", extra=kv(error=repr(err)))
            deadline = time.monotonic() + self.reconcile_s
            while not stop.is_set() and not self._sweep.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                await woken(self._sweep, stop, left)

    async def reconcile(self) -> None:
        """One level-triggered pass over the tables (see the module docstring)."""
        async with self.c.ctx.pool.acquire() as conn:
            allocs = [a for a in await repo_upkeep.live_allocations(conn) if self.c.owns(a.job_id)]
            runs = await repo_upkeep.run_rows(conn, [a.job_id for a in allocs])
            unsettled = [
                r for r in await repo.active_runs(conn)
                if r.state != JobState.RUNNING and self.c.owns(r.job_id)
            ]  # fmt: skip
        runs = {j: r for j, r in runs.items() if self.c.owns(j)}
        plan = plan_reconcile(allocs, runs, LOST_AFTER_S)
        for alloc in plan.start:
            log.warning("starting an allocation no event started", extra=kv(job=alloc.job_id))
            await self.c.start_allocation(alloc.job_id, alloc.attempt, None)
        for job_id in plan.settle:
            log.warning("settling a run whose allocation is gone", extra=kv(job=job_id))
            await self.c.settle_orphan(job_id)
        for run in unsettled:
            if not self.c.effects.busy(run.job_id):
                await self._resume(run)
        if self.c.settings.grow_back:  # a node.recovered seen while the job was
            await self.c.offer_growth()  # restarting (not RUNNING) asked for nothing

    async def _resume(self, run: repo.Run) -> None:
        """Relaunch an interrupted start (the agents treat a repeated start of the same
        generation as done) or finish an interrupted stop."""
        async with self.c.lock(run.job_id):
            async with self.c.ctx.pool.acquire() as conn:
                current = await repo.lock_run(conn, run.job_id)
                loaded = await repo.load_spec(conn, run.job_id)
                wait_s = await repo_upkeep.resume_after_s(conn, run.job_id)
            if current is None or loaded is None or current.state != run.state:
                return
            if self.c.effects.busy(run.job_id):
                return
            # A COMPLETING run's restart count may be its requeue's next one already:
            # any worker of the ending attempt is stopped, and no other.
            fx = Effects(spec=loaded[0], job_id=run.job_id, stop_key=(current.attempt, None))
            if current.state == JobState.STARTING:  # what is left of a restart backoff
                fx.start = Generation(
                    job_id=current.job_id, attempt=current.attempt,
                    generation=current.restart_count, nodes=current.nodes, gpus=current.gpus,
                )  # fmt: skip
                fx.start_delay_s = wait_s
            else:  # what is left of a requeue's delay
                grace = self.c.config.kill_wait_s
                fx.stops = [core.StopWorkers(nodes=current.nodes, grace_s=grace)]
                fx.end_delay_s = wait_s
            self.c.effects.enqueue(fx)

    # --- ownership: the shard leases and the mailbox ----------------------------------

    async def hold_loop(self, stop: asyncio.Event) -> None:
        """Renew, take and release shards every ttl/4; a shard just taken is swept at
        once (its timers and a reconcile of its runs), not at the next period."""
        await every(self.c.owners.ttl_s / 4, stop, self.hold)

    async def hold(self) -> None:
        """One pass; the sweep of shards just taken runs in the other loops, so a
        long one never delays the next renewal."""
        async with self.c.ctx.pool.acquire() as conn, conn.transaction():
            taken = await self.c.owners.hold(conn, self.c.acting_on)
        if taken:
            self._wake.set()  # timers
            self._sweep.set()  # reconcile (the mailbox is looked at every 0.2 s anyway)

    async def mailbox_loop(self, stop: asyncio.Event) -> None:
        await every(MAILBOX_S, stop, self.drain)

    async def drain(self) -> None:
        """The events other replicas parked for this one's jobs, oldest first; each is
        handled (idempotent: the inbox) and then dropped."""
        shards = self.c.owners.shards()
        if not shards:
            return
        async with self.c.ctx.pool.acquire() as conn:
            parked = await repo_upkeep.parked(conn, shards, 200)
        for row_id, job_id, event in parked:
            await self.c.dispatch(job_id, event)
            async with self.c.ctx.pool.acquire() as conn:
                await repo_upkeep.unpark(conn, row_id)

    async def hand_over(self) -> None:
        """At a clean stop: free the shards now, so another replica takes them at
        once; a failure leaves them to expire."""
        try:
            async with self.c.ctx.pool.acquire() as conn, conn.transaction():
                await self.c.owners.release_all(conn)
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("shards left to expire", extra=kv(error=repr(err)))
