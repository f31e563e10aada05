"""Job coordinator shell (cluster side): turns allocations into running gangs and keeps
them running through faults.

- `job.allocated` -> start workers on every node, or on none (gang)
- `worker.exited` -> all 0: COMPLETED; any other: stop the rest, FAILED
- `node.fault` / `node.down` -> elastic job: stop all, restart on the survivors with the
  new world size (shrink); fixed-size job: stop all, requeue with the node excluded
- `job.cancel_requested`, `job.preempt_requested`, time limits -> stop, then the end state
  once every worker is gone (COMPLETING until then, so the GPUs stay held)
- usage ticks while running, so long jobs are charged as they run
"""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime

import msgspec

from services.launcher import repo
from services.launcher.env import build_env, place_worker
from services.launcher.executor import free_port
from services.launcher.torchrun import worker_argv
from shared.api import AGENT_PREFIX, AgentReply, StopWorkers, WorkerSpec
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
    JobStarted,
    NodeDown,
    NodeFault,
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
)
CONSUMER = "launcher"


def now_utc() -> datetime:
    return datetime.now(UTC)


class Coordinator:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self._background: set[asyncio.Task[None]] = set()

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
                await self.worker_exited(event)
            case NodeFault() if event.affects_job or event.excludes_node:
                await self.node_lost(event.node, event, fatal_to_node=event.excludes_node)
            case NodeDown():
                await self.node_lost(event.node, event, fatal_to_node=True)
            case JobCancelRequested():
                await self.stop_job(event, event.job_id, "CANCELLED", event.reason)
            case JobPreemptRequested():
                reason = f"preempted by job {event.for_job_id}"
                await self.stop_job(event, event.job_id, "REQUEUED", reason, grace=event.grace_s)
            case _:
                return

    # --- start ----------------------------------------------------------------------

    async def allocated(self, ev: JobAllocated) -> None:
        gpus = {g.node: list(g.gpus) for g in ev.grants}
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                return
            loaded = await repo.load_spec(conn, ev.job_id)
            if loaded is None:
                return
            spec, cancelled = loaded
            current = await repo.lock_run(conn, ev.job_id)
            if (
                current is not None
                and current.attempt >= ev.attempt
                and current.state != "REQUEUED"
            ):
                return
            if cancelled:
                await repo.finish_unstarted(conn, ev.job_id, "CANCELLED", "cancelled", now_utc())
                await outbox_add(
                    conn, self._finished(spec, ev.job_id, ev.attempt, "CANCELLED", 0.0)
                )
                return
            excluded = current.excluded if current else ()
            run = await repo.start_run(conn, ev.job_id, ev.attempt, gpus, excluded)
            run = msgspec.structs.replace(
                run, restart_count=current.restart_count if current else 0
            )
        self.ctx.relay.kick()
        await self.launch(spec, run)

    async def launch(self, spec: JobSpec, run: repo.Run) -> None:
        """Start one generation of workers on every node of `run`, or on none."""
        async with self.ctx.pool.acquire() as conn:
            addresses = await repo.node_addresses(conn, list(run.nodes))
        nodes = list(run.nodes)
        master = addresses.get(nodes[0], "127.0.0.1")
        port = free_port()
        specs = [self._worker(spec, run, node, nodes, master, port) for node in nodes]
        replies = await asyncio.gather(
            *(self._agent(n, "start", s) for n, s in zip(nodes, specs, strict=True))
        )
        failed = [n for n, r in zip(nodes, replies, strict=True) if not r.ok]
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            current = await repo.lock_run(conn, run.job_id)
            if current is None or (current.attempt, current.restart_count) != (
                run.attempt,
                run.restart_count,
            ):
                return  # superseded while starting
            if failed:
                await self._gang_failed(conn, spec, current, failed, replies)
            else:
                await repo.mark_running(conn, current, now_utc())
                await outbox_add(
                    conn,
                    JobStarted(
                        job_id=run.job_id,
                        attempt=run.attempt,
                        nodes=run.nodes,
                        world_size=len(nodes),
                    ),
                )
        self.ctx.relay.kick()
        if failed:
            await self._stop_everywhere(run.job_id, [n for n in nodes if n not in failed], 2.0)
        log.info(
            "launched", extra=kv(job=run.job_id, nodes=nodes, gen=run.restart_count, failed=failed)
        )

    async def _gang_failed(
        self, conn: Conn, spec: JobSpec, run: repo.Run, failed: list[str], replies: list[AgentReply]
    ) -> None:
        why = "; ".join(r.message for r in replies if not r.ok)
        reason = f"could not start on {','.join(failed)}: {why}"
        await self._end(conn, spec, run, "REQUEUED", reason, exclude=tuple(failed))

    def _worker(
        self, spec: JobSpec, run: repo.Run, node: str, nodes: list[str], master: str, port: int
    ) -> WorkerSpec:
        placement = place_worker(
            spec,
            job_id=run.job_id,
            attempt=run.attempt,
            restart_count=run.restart_count,
            node=node,
            nodelist=nodes,
            gpus=run.gpus.get(node, []),
            master_port=port,
        )
        placement = msgspec.structs.replace(
            placement,
            master_addr=master,
            rdzv_endpoint=f"{master}:{port}",
            rdzv_id=f"{run.job_id}-{run.attempt}-{run.restart_count}",
        )
        runnable = msgspec.structs.replace(spec, script="{spool}/" + spec.script_name)
        out = expand_output(spec.output or "muster-%j.out", spec, run.job_id, node)
        err = expand_output(spec.error or spec.output or "muster-%j.out", spec, run.job_id, node)
        return WorkerSpec(
            job_id=run.job_id,
            attempt=run.attempt,
            generation=run.restart_count,
            argv=tuple(worker_argv(runnable, placement, sys.executable)),
            env=build_env(spec, placement, _base_env()),
            workdir=spec.workdir,
            stdout=out,
            stderr=err,
            run_as=None if spec.user == _agent_user() else spec.user,
            script=spec.script,
            script_name=spec.script_name,
        )

    # --- exits ----------------------------------------------------------------------

    async def worker_exited(self, ev: WorkerExited) -> None:
        to_stop: list[str] = []
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                return
            run = await repo.lock_run(conn, ev.job_id)
            if run is None or (run.attempt, run.restart_count) != (ev.attempt, ev.generation):
                return  # an older generation: already handled when it was replaced
            if run.state not in ("RUNNING", "COMPLETING", "STARTING"):
                return
            exits = await repo.record_exit(
                conn, ev.job_id, ev.attempt, ev.generation, ev.node, ev.exit_code, ev.signal
            )
            done = {r["node"] for r in exits}
            bad = [r for r in exits if r["exit_code"] != 0]
            all_done = set(run.nodes) <= done
            loaded = await repo.load_spec(conn, ev.job_id)
            assert loaded is not None
            spec = loaded[0]
            if run.state == "COMPLETING":
                if all_done:
                    await self._end(conn, spec, run, run.stopping_to or "FAILED", "")
            elif bad and run.state == "RUNNING":
                first = bad[0]
                code, sig = first["exit_code"], first["signal"]
                reason = f"node {first['node']} exited with " + (
                    f"signal {sig}" if sig else f"code {code}"
                )
                if ev.oom_killed:
                    reason = f"node {ev.node} ran out of memory"
                if all_done:
                    await self._end(conn, spec, run, "FAILED", reason, exit_code=code, signal=sig)
                else:
                    await repo.begin_stopping(conn, run.job_id, "FAILED", reason)
                    to_stop = [n for n in run.nodes if n not in done]
            elif all_done:
                await self._end(conn, spec, run, "COMPLETED", "", exit_code=0)
        self.ctx.relay.kick()
        if to_stop:
            self._spawn(self._stop_everywhere(ev.job_id, to_stop, self.settings.kill_wait_s))

    # --- faults ---------------------------------------------------------------------

    async def node_lost(self, node: str, ev: Event, *, fatal_to_node: bool) -> None:
        async with self.ctx.pool.acquire() as conn:
            if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                return
            jobs = await repo.runs_on_node(conn, node)
        if isinstance(ev, NodeFault) and ev.job_id is not None and not fatal_to_node:
            jobs = [j for j in jobs if j == ev.job_id]
        await asyncio.gather(*(self._recover(job_id, node, ev, fatal_to_node) for job_id in jobs))

    async def _recover(self, job_id: int, node: str, ev: Event, fatal_to_node: bool) -> None:
        xid = f"xid {ev.xid} " if isinstance(ev, NodeFault) else ""
        reason = f"{xid}on {node}" if isinstance(ev, NodeFault) else f"node {node} down"
        async with self.ctx.pool.acquire() as conn:
            run = await repo.lock_run(conn, job_id)
            loaded = await repo.load_spec(conn, job_id)
        if run is None or loaded is None or run.state not in ("RUNNING", "STARTING"):
            return
        spec = loaded[0]
        # Stop first, everywhere: the survivors must not keep a dead peer's collective.
        await self._stop_everywhere(job_id, list(run.nodes), self.settings.fault_kill_wait_s)
        survivors = {n: g for n, g in run.gpus.items() if n != node}
        restart: repo.Run | None = None
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            current = await repo.lock_run(conn, job_id)
            if current is None or (current.attempt, current.restart_count) != (
                run.attempt,
                run.restart_count,
            ):
                return
            if not fatal_to_node:
                await self._end(conn, spec, current, "FAILED", f"application error: {reason}")
            elif run.restart_count >= self.settings.restart_limit:
                await self._end(
                    conn, spec, current, "NODE_FAIL", f"{reason}; restart limit reached"
                )
            elif spec.nodes_min < spec.nodes_max and len(survivors) >= spec.nodes_min:
                restart = await repo.reshape(
                    conn, current, survivors, f"shrink: {reason}", now_utc()
                )
                await outbox_add(
                    conn,
                    JobReconfigured(
                        job_id=job_id,
                        attempt=run.attempt,
                        grants=tuple(Grant(node=n, gpus=tuple(g)) for n, g in survivors.items()),
                        dropped_nodes=(node,),
                        world_size=len(survivors),
                        reason=reason,
                    ),
                )
            else:
                await self._end(conn, spec, current, "REQUEUED", reason, exclude=(node,))
        self.ctx.relay.kick()
        if restart is not None:
            await self.launch(spec, restart)

    # --- stopping -------------------------------------------------------------------

    async def stop_job(
        self, ev: Event, job_id: int, to_state: str, reason: str, grace: float | None = None
    ) -> None:
        nodes: list[str] = []
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, ev.event_id):
                return
            run = await repo.lock_run(conn, job_id)
            loaded = await repo.load_spec(conn, job_id)
            if loaded is None:
                return
            spec = loaded[0]
            if run is None or run.state in ("PENDING",):
                if to_state == "CANCELLED":
                    await repo.finish_unstarted(conn, job_id, "CANCELLED", reason, now_utc())
                    await outbox_add(conn, self._finished(spec, job_id, 0, "CANCELLED", 0.0))
            elif run.state == "REQUEUED" and to_state == "CANCELLED":
                await self._end(conn, spec, run, "CANCELLED", reason)
            elif run.state in ("RUNNING", "STARTING"):
                if to_state == "REQUEUED" and not spec.requeue:
                    to_state = "PREEMPTED"
                await repo.begin_stopping(conn, job_id, to_state, reason)
                nodes = list(run.nodes)
        self.ctx.relay.kick()
        if nodes:
            wait = self.settings.kill_wait_s if grace is None else float(grace)
            self._spawn(self._stop_everywhere(job_id, nodes, wait))

    async def _stop_everywhere(self, job_id: int, nodes: list[str], grace_s: float) -> None:
        req = StopWorkers(job_id=job_id, grace_s=grace_s)
        await asyncio.gather(*(self._agent(n, "stop", req, timeout=grace_s + 5) for n in nodes))

    async def _end(
        self,
        conn: Conn,
        spec: JobSpec,
        run: repo.Run,
        state: str,
        reason: str,
        *,
        exit_code: int | None = None,
        signal: int | None = None,
        exclude: tuple[str, ...] = (),
    ) -> None:
        now = now_utc()
        used = await repo.finish(
            conn, run, state, reason, now, exit_code=exit_code, signal=signal, exclude=exclude
        )
        model = await repo.gpu_model(conn, list(run.nodes))
        event: Event
        if state == "REQUEUED":
            event = JobRequeued(
                job_id=run.job_id,
                attempt=run.attempt,
                reason=reason,
                excluded_nodes=exclude,
                restart_count=run.restart_count + 1,
                gpu_seconds=used,
                user=spec.user,
                account=spec.account,
            )
            tick = UsageTicked(
                job_id=run.job_id,
                attempt=run.attempt,
                user=spec.user,
                account=spec.account,
                gpu_model=model,
                gpu_seconds_total=used,
            )
            await outbox_add(conn, event, tick)
        else:
            await outbox_add(
                conn,
                msgspec.structs.replace(
                    self._finished(spec, run.job_id, run.attempt, state, used),
                    reason=reason,
                    exit_code=exit_code,
                    signal=signal,
                    gpu_model=model,
                    started_at=run.started_at,
                    ended_at=now,
                ),
            )
        log.info("job ended", extra=kv(job=run.job_id, state=state, reason=reason))

    def _finished(
        self, spec: JobSpec, job_id: int, attempt: int, state: str, used: float
    ) -> JobFinished:
        return JobFinished(
            job_id=job_id,
            attempt=attempt,
            state=state,
            user=spec.user,
            account=spec.account,
            gpu_seconds=used,
        )

    # --- timers ---------------------------------------------------------------------

    async def _timers(self, stop: asyncio.Event) -> None:
        await every(1.0, stop, self.check_timers)

    async def check_timers(self) -> None:
        async with self.ctx.pool.acquire() as conn:
            overdue = await repo.overdue(conn)
            stuck = await repo.stuck_stopping(conn, self.settings.kill_wait_s + 15)
        for job_id in overdue:
            await self._time_out(job_id)
        for job_id in stuck:
            await self._force_end(job_id)

    async def _time_out(self, job_id: int) -> None:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            run = await repo.lock_run(conn, job_id)
            if run is None or run.state != "RUNNING":
                return
            await repo.begin_stopping(conn, job_id, "TIMEOUT", "time limit reached")
        self._spawn(self._stop_everywhere(job_id, list(run.nodes), self.settings.kill_wait_s))

    async def _force_end(self, job_id: int) -> None:
        """A stop whose workers never reported (their node died): end it anyway."""
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            run = await repo.lock_run(conn, job_id)
            loaded = await repo.load_spec(conn, job_id)
            if run is None or loaded is None or run.state != "COMPLETING":
                return
            await self._end(
                conn, loaded[0], run, run.stopping_to or "FAILED", "workers lost while stopping"
            )
        self.ctx.relay.kick()

    async def _ticks(self, stop: asyncio.Event) -> None:
        await every(self.settings.usage_tick_s, stop, self.tick_usage)

    async def tick_usage(self) -> None:
        """Charge running jobs as they run; fairshare takes differences, so a repeated
        or reordered tick is harmless."""
        now = now_utc()
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

    # --- plumbing -------------------------------------------------------------------

    async def reconcile(self) -> None:
        """On start: relaunch generations whose start was interrupted (STARTING); the
        agents treat a repeated start of the same generation as done."""
        async with self.ctx.pool.acquire() as conn:
            runs = [r for r in await repo.active_runs(conn) if r.state == "STARTING"]
            specs = {r.job_id: await repo.load_spec(conn, r.job_id) for r in runs}
        for run in runs:
            loaded = specs[run.job_id]
            if loaded is not None:
                self._spawn(self.launch(loaded[0], run))

    async def _agent(
        self, node: str, verb: str, body: msgspec.Struct, timeout: float = 5.0
    ) -> AgentReply:
        try:
            raw = await self.ctx.bus.request(
                f"{AGENT_PREFIX}{node}.{verb}", msgspec.json.encode(body), timeout=timeout
            )
        except (TimeoutError, OSError) as err:
            return AgentReply(ok=False, message=f"node {node} did not answer: {err!r}")
        except Exception as err:  # nats errors (no responders, timeout) are not OSErrors
            return AgentReply(ok=False, message=f"node {node}: {type(err).__name__}")
        return msgspec.json.decode(raw, type=AgentReply)

    def _spawn(self, coro: object) -> None:
        assert asyncio.iscoroutine(coro)
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def expand_output(pattern: str, spec: JobSpec, job_id: int, node: str) -> str:
    """`%j %x %u %N %A %a %%` in an output path, as sbatch expands them."""
    values = {
        "j": str(job_id),
        "x": spec.name,
        "u": spec.user,
        "N": node,
        "A": str(spec.array_job_id or job_id),
        "a": str(spec.array_task_id if spec.array_task_id is not None else 4294967294),
        "%": "%",
    }
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern) and pattern[i + 1] in values:
            out.append(values[pattern[i + 1]])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _base_env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _agent_user() -> str:
    import getpass

    return getpass.getuser()
