"""Shell: the launcher's answer to a node that (re)registers.

`node.registered` lists the workers the node's agent still runs. Every one that is not
its job's live (attempt, generation) on that node (`reconcile_core.stale_workers`) is
stopped through the agent, waiting for the stop; then `node.cleaned` goes out through
the outbox, also when nothing had to be stopped (the health monitor keeps the node out
of service until it has the answer). The debt is a `node_cleanings` row written with
the event's inbox entry, so an agent that cannot be reached is retried every reconcile
period (`retry_loop`) and a restarted launcher still answers.

Its own durable consumer: a stop waits up to its grace, which must not hold up the
job events behind it.
"""

from __future__ import annotations

import asyncio
import logging

from services.launcher import repo_upkeep
from services.launcher.driver import Driver
from services.launcher.reconcile_core import stale_workers
from shared.api import AgentReply
from shared.db import inbox_first_time, outbox_add
from shared.events import AnyEvent, NodeCleaned, NodeRegistered, RunningWorker
from shared.logs import kv
from shared.runtime import every

log = logging.getLogger(__name__)

CONSUMER = "launcher-nodes"
SUBJECTS = ("muster.node.registered.>",)


class Cleaner:
    def __init__(self, coordinator: Driver, *, retry_s: float) -> None:
        self.c = coordinator
        self.retry_s = retry_s

    async def consume(self, stop: asyncio.Event) -> None:
        await self.c.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    async def retry_loop(self, stop: asyncio.Event) -> None:
        """The nodes still owed an answer, every reconcile period, all at once: one
        node that never answers must not delay the others."""
        await every(self.retry_s, stop, self.retry_owed)

    async def retry_owed(self) -> None:
        async with self.c.ctx.pool.acquire() as conn:
            owed = await repo_upkeep.cleanings_owed(conn)
        await asyncio.gather(*(self.clean(node, boot, reported) for node, boot, reported in owed))

    async def handle(self, event: AnyEvent) -> None:
        if not isinstance(event, NodeRegistered):
            return
        async with self.c.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, event.event_id):
                return
            await repo_upkeep.owe_cleaning(conn, event.node, event.boot_id, event.running)
        await self.clean(event.node, event.boot_id, event.running)

    async def clean(self, node: str, boot_id: str, reported: tuple[RunningWorker, ...]) -> bool:
        """Stop what `node` runs of ended attempts, then answer; False: an agent did
        not confirm a stop, so the answer waits for the next reconcile."""
        stops = [self._stop_if_stale(node, w) for w in reported]
        results = await asyncio.gather(*stops)
        failed = [w for w, (_, reply) in zip(reported, results, strict=True) if not reply.ok]
        stopped = tuple(w for w, (was_stale, _) in zip(reported, results, strict=True) if was_stale)
        async with self.c.ctx.pool.acquire() as conn, conn.transaction():
            if failed:
                await repo_upkeep.count_try(conn, node)
                log.warning(
                    "node not cleaned yet", extra=kv(node=node, failed=[w.job_id for w in failed])
                )
                return False
            if await repo_upkeep.settle_cleaning(conn, node, boot_id):
                await outbox_add(conn, NodeCleaned(node=node, boot_id=boot_id, stopped=stopped))
        self.c.ctx.relay.kick()
        log.info("node cleaned", extra=kv(node=node, boot=boot_id, stopped=len(stopped)))
        return True

    async def _stop_if_stale(self, node: str, worker: RunningWorker) -> tuple[bool, AgentReply]:
        """Decide under the job's lock, so the stop takes its place on the job's effect
        chain: an earlier start finishes first, a later decision's start comes after."""
        job_id = worker.job_id
        async with self.c.lock(job_id):
            async with self.c.ctx.pool.acquire() as conn:
                runs = await repo_upkeep.run_rows(conn, [job_id])
            if not stale_workers(node, (worker,), runs):
                return False, AgentReply(ok=True, message="live")
            answer: asyncio.Future[AgentReply] = asyncio.get_running_loop().create_future()

            async def stop() -> None:
                grace = self.c.config.restart_grace_s
                key = (worker.attempt, worker.generation)  # never a newer worker
                replies = await self.c.agents.stop(job_id, (node,), grace, key)
                answer.set_result(replies[node])

            task = self.c.effects.after(job_id, stop)
        if task is None:  # shutting down: the next owner answers
            return True, AgentReply(ok=False, message="launcher stopping")
        await asyncio.wait([task])
        if not answer.done():
            return True, AgentReply(ok=False, message="stop did not complete")
        return True, answer.result()
