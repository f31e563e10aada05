"""Node executor shell: runs on every node and starts, stops and watches that node's
job workers, answering the job coordinator over NATS request-reply.

Workers are real processes in their own process group. When a worker's group is gone
the agent publishes `worker.exited` to JetStream with a deterministic message id, so a
coordinator that was down at that moment still hears of it, exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal
from dataclasses import dataclass
from pathlib import Path

import msgspec

from services.launcher.executor import LaunchError, Worker, resolve_run_as, spawn_worker
from shared.api import AGENT_PREFIX, AgentReply, StopWorkers, WorkerSpec
from shared.bus import Bus
from shared.events import WorkerExited
from shared.logs import kv

log = logging.getLogger(__name__)


@dataclass
class _Running:
    spec: WorkerSpec
    worker: Worker
    watcher: asyncio.Task[None]


class NodeExecutor:
    def __init__(self, bus: Bus, node: str, *, allow_root: bool, spool_root: str) -> None:
        self.bus = bus
        self.spool_root = spool_root
        self.node = node
        self.allow_root = allow_root
        self.running: dict[int, _Running] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        prefix = f"{AGENT_PREFIX}{self.node}."
        await self.bus.serve(prefix + "start", self.node, self._on_start)
        await self.bus.serve(prefix + "stop", self.node, self._on_stop)
        await self.bus.serve(prefix + "status", self.node, self._on_status)

    async def shutdown(self, grace_s: float) -> None:
        """Agent stopping: workers are left running only if we are killed; on a clean
        stop they get SIGTERM and `grace_s` like a drained node."""
        await asyncio.gather(
            *(r.worker.terminate(grace_s) for r in list(self.running.values())),
            return_exceptions=True,
        )
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(task, timeout=grace_s)

    async def _on_start(self, payload: bytes, _subject: str) -> bytes:
        spec = msgspec.json.decode(payload, type=WorkerSpec)
        return msgspec.json.encode(await self.start(spec))

    async def start(self, spec: WorkerSpec) -> AgentReply:
        current = self.running.get(spec.job_id)
        if current is not None:
            same = (current.spec.attempt, current.spec.generation) == (
                spec.attempt,
                spec.generation,
            )
            if same:
                return AgentReply(ok=True, message="already running")
            await current.worker.terminate(2.0)
        try:
            run_as = (
                resolve_run_as(spec.run_as, allow_root=self.allow_root) if spec.run_as else None
            )
            spool = self._spool(spec, run_as.uid if run_as else None)
            worker = await spawn_worker(
                [a.replace("{spool}", spool) for a in spec.argv],
                {k: v.replace("{spool}", spool) for k, v in spec.env.items()},
                spec.workdir,
                spec.stdout,
                spec.stderr,
                run_as,
                allow_root=self.allow_root,
                append=True,  # every node (and restart) of a job adds to its files
            )
        except (LaunchError, OSError) as err:
            log.warning("worker did not start", extra=kv(job=spec.job_id, error=str(err)))
            return AgentReply(ok=False, message=str(err))
        watcher = asyncio.create_task(self._watch(spec, worker))
        self.running[spec.job_id] = _Running(spec, worker, watcher)
        log.info("worker started", extra=kv(job=spec.job_id, gen=spec.generation, pid=worker.pid))
        return AgentReply(ok=True, message=f"pid {worker.pid}")

    def _spool(self, spec: WorkerSpec, uid: int | None) -> str:
        """Write the job's script where this node's worker runs it."""
        folder = Path(self.spool_root) / f"job-{spec.job_id}"
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / Path(spec.script_name).name
        script.write_text(spec.script)
        script.chmod(0o755)
        if uid is not None:
            os.chown(folder, uid, -1)
            os.chown(script, uid, -1)
        return str(folder)

    async def _watch(self, spec: WorkerSpec, worker: Worker) -> None:
        status = await worker.wait()
        current = self.running.get(spec.job_id)
        if current is not None and current.worker is worker:
            del self.running[spec.job_id]
        event = WorkerExited(
            job_id=spec.job_id,
            attempt=spec.attempt,
            node=self.node,
            exit_code=status.exit_code,
            signal=status.signal,
            oom_killed=status.oom_killed,
            generation=spec.generation,
        )
        msg_id = f"exit-{spec.job_id}-{spec.attempt}-{spec.generation}-{self.node}"
        await self._publish_until_done(event, msg_id)

    async def _publish_until_done(self, event: WorkerExited, msg_id: str) -> None:
        from shared.events import encode, subject_of

        while True:
            try:
                await self.bus.publish_raw(subject_of(event), encode(event), msg_id, {})
                return
            except (TimeoutError, OSError) as err:
                log.warning("cannot report worker exit yet", extra=kv(error=repr(err)))
                await asyncio.sleep(0.5)

    async def _on_stop(self, payload: bytes, _subject: str) -> bytes:
        req = msgspec.json.decode(payload, type=StopWorkers)
        current = self.running.get(req.job_id)
        if current is None:
            return msgspec.json.encode(AgentReply(ok=True, message="not running"))
        # `B:SIGUSR1` (from `--signal=B:USR1`): the job's script only, not its group.
        leader_only, _, name = req.signal.rpartition(":")
        sig = _signal.Signals[name] if name.startswith("SIG") else _signal.SIGTERM
        if not req.wait:
            current.worker.signal(sig, leader_only=leader_only == "B")
            return msgspec.json.encode(AgentReply(ok=True, message=f"sent {sig.name}"))
        if sig == _signal.SIGTERM:
            await current.worker.terminate(req.grace_s)
        else:
            current.worker.signal(sig)
            await current.worker.terminate(req.grace_s)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(current.watcher), timeout=5.0)
        return msgspec.json.encode(AgentReply(ok=True, message="stopped"))

    async def _on_status(self, _payload: bytes, _subject: str) -> bytes:
        alive = tuple(
            (job_id, r.spec.attempt, r.spec.generation)
            for job_id, r in sorted(self.running.items())
        )
        return msgspec.json.encode(AgentReply(ok=True, workers=alive))
