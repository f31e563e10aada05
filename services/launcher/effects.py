"""Shell: carries out what committed decisions owe the node agents.

A decision commits first; its `Effects` (signal, stops, the next generation's start,
the end of a COMPLETING run) then run here, in commit order per job, on a chain: a later
decision's stop never overtakes an earlier start, save for one copy of it: a stop of one
generation, decided while an effect of the job is still under way (its start waiting on a
slow site prolog), is also sent at once beside the chain. The agent keeps a stop of a
start it has not seen yet and never runs that generation, and hands one of a start under
way to its stepd, which then spawns no worker: a job cancelled during its prolog never
begins. The chain's own stop still follows, in order. Every task is owned: `close` waits for
them with a graceful timeout at shutdown and cancels the rest, which is safe because the
database says what is left (a STARTING run is relaunched and a COMPLETING run ended by
the next reconcile, see upkeep.py). A best-effort stop (a node that is down) runs beside
the chain, bounded, so nothing waits on an agent that may be gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import msgspec

from services.launcher import coordinator_core as core
from services.launcher.gang import Generation
from shared.api import AgentReply
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import TaskSet

log = logging.getLogger(__name__)


class AgentCalls(Protocol):
    """What the runner asks of the node agents (`gang.Agents`; a fake in tests)."""

    async def stop(
        self, job_id: int, nodes: tuple[str, ...], grace_s: float,
        key: tuple[int, int | None] | None = None,
    ) -> dict[str, AgentReply]: ...  # fmt: skip

    async def signal(self, job_id: int, act: core.SignalWorkers) -> None: ...


Launch = Callable[[JobSpec, Generation], Awaitable[None]]
EndStopped = Callable[[int], Awaitable[None]]
Owns = Callable[[int], bool]


class Effects(msgspec.Struct, kw_only=True):
    """What a committed decision still owes the node agents, in this order."""

    spec: JobSpec
    job_id: int
    # (attempt, generation) the stops aim at: the agents stop no other worker of the
    # job (None: whatever of the job runs, as after an agent restart).
    stop_key: tuple[int, int | None] | None = None
    signals: list[core.SignalWorkers] = []
    stops: list[core.StopWorkers] = []
    start: Generation | None = None
    start_delay_s: float = 0.0
    end_delay_s: float | None = None  # set: end the COMPLETING run after the stops

    def holds_gpus(self) -> bool:
        """Whether the run must stay COMPLETING until these stops are answered."""
        return any(s.nodes and not s.best_effort for s in self.stops)


class EffectRunner:
    def __init__(
        self, agents: AgentCalls, launch: Launch, end_stopped: EndStopped,
        owns: Owns = lambda _job_id: True,  # one replica alone owns every job
    ) -> None:  # fmt: skip
        self.agents = agents
        self.owns = owns
        self._launch = launch
        self._end_stopped = end_stopped
        self._chains: dict[int, asyncio.Task[None]] = {}
        self._tasks = TaskSet()
        self._closing = False

    def busy(self, job_id: int) -> bool:
        """Whether effects of `job_id` are still being carried out in this process."""
        return job_id in self._chains

    def jobs(self) -> list[int]:
        """The jobs whose effects are being carried out in this process."""
        return list(self._chains)

    def enqueue(self, fx: Effects) -> None:
        """Carry out `fx` after every effect enqueued before for its job (and its stops of
        one generation at once as well, when an earlier effect is still under way)."""
        if self.busy(fx.job_id) and fx.stop_key is not None and fx.stop_key[1] is not None:
            for stop in (s for s in fx.stops if not s.best_effort):
                self.spawn(self._ask_to_stop(fx, stop, "asked to stop ahead"), "stop ahead")
        self.after(fx.job_id, lambda: self._carry_out(fx))

    def after(self, job_id: int, step: Callable[[], Awaitable[None]]) -> asyncio.Task[None] | None:
        """Run `step` on `job_id`'s chain; call it under the job's lock, so the chain's
        order is the order of the decisions."""
        previous = self._chains.get(job_id)

        async def chained() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            await step()

        task = self.spawn(chained(), f"effects of job {job_id}")
        if task is None:
            return None
        self._chains[job_id] = task

        def unchain(t: asyncio.Task[None]) -> None:
            if self._chains.get(job_id) is t:
                del self._chains[job_id]

        task.add_done_callback(unchain)
        return task

    def spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None] | None:
        """Run `coro` as an owned task; its failure is logged (the reconcile repairs what
        it left undone). Refused once closing: the next owner of the work resumes it."""
        if self._closing:
            coro.close()
            return None
        task = self._tasks.spawn(coro)

        def done(t: asyncio.Task[None]) -> None:
            if not t.cancelled() and t.exception() is not None:
                log.error("effects failed", extra=kv(what=what, error=repr(t.exception())))

        task.add_done_callback(done)
        return task

    async def close(self, timeout_s: float) -> None:
        """Let the effects in hand finish for `timeout_s`, then cancel the rest."""
        self._closing = True
        await self._tasks.close(timeout_s)

    async def _carry_out(self, fx: Effects) -> None:
        """Each step first asks whether this replica still owns the job: one that lost
        it (paused past its lease) leaves the rest to the new owner's reconcile."""
        if not self._still_owned(fx.job_id):
            return
        for stop in (s for s in fx.stops if s.best_effort):
            self.spawn(self._ask_to_stop(fx, stop), f"best-effort stop of {fx.job_id}")
        for act in fx.signals:
            await self.agents.signal(fx.job_id, act)
        waited = [s for s in fx.stops if not s.best_effort]
        await asyncio.gather(
            *(self.agents.stop(fx.job_id, s.nodes, s.grace_s, fx.stop_key) for s in waited)
        )
        if fx.start is not None:
            if fx.start_delay_s > 0:
                await asyncio.sleep(fx.start_delay_s)
            if not self._still_owned(fx.job_id):
                return
            await self._launch(fx.spec, fx.start)
        if fx.end_delay_s is not None:
            if fx.end_delay_s > 0:  # a requeue's backoff: the GPUs stay held meanwhile
                await asyncio.sleep(fx.end_delay_s)
            await self._end_stopped(fx.job_id)

    def _still_owned(self, job_id: int) -> bool:
        if self.owns(job_id):
            return True
        log.warning("no longer the job's owner: left to the new one", extra=kv(job=job_id))
        return False

    async def _ask_to_stop(
        self, fx: Effects, stop: core.StopWorkers, what: str = "asked a lost node to stop"
    ) -> None:
        job_id = fx.job_id
        replies = await self.agents.stop(job_id, stop.nodes, stop.grace_s, fx.stop_key)
        for node, reply in replies.items():
            log.info(
                what,
                extra=kv(job=job_id, node=node, ok=reply.ok, message=reply.message),
            )
