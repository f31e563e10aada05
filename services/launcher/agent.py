"""Node executor shell: runs on every node and starts, stops and watches that node's
job workers, answering the job coordinator over NATS request-reply.

Each worker runs under its own step supervisor (`stepd`, a process in its own session)
which outlives this agent; what the agent started is in the node's worker table on disk
(`worker_table.py`), never only in memory. A restarted agent re-adopts every worker
whose supervisor still runs (pid and start time both match), and reports the exit of
every one that ended while it was away, from the status stepd recorded. When a worker's
supervisor is gone the agent publishes `worker.exited` to JetStream with a deterministic
message id, so a coordinator that was down at that moment still hears of it, exactly
once; the record is removed once that publish succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal as _signal
import subprocess
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from services.launcher import cgroups
from services.launcher.accounts import AccountPolicy, job_account
from services.launcher.executor import (
    LaunchError,
    RunAs,
    free_port,
    process_gone,
)
from services.launcher.hooks import PrologFailed
from services.launcher.isolation import NodeIsolation, for_worker
from services.launcher.kept import KeptKeys
from services.launcher.spool import Spool
from services.launcher.stepd_client import START_TIMEOUT_S, Stepd, Zygote, started_or_ended
from services.launcher.steps_agent import StepRunner, end_left_tasks
from services.launcher.torchrun import fill_on_node
from services.launcher.worker_table import (
    Ending,
    StepExit,
    StepSpec,
    StepStarted,
    Verdict,
    WorkerRecord,
    WorkerTable,
    alive,
    gone,
    judge,
    kill_group,
    killed,
    lost_exit,
    process_ref,
    touch,
    write_struct,
)
from shared.agent_auth import TrustedKeys, check
from shared.api import AGENT_PREFIX, AgentReply, StopWorkers, WorkerSpec
from shared.bus import Bus
from shared.events import NodeHookFailed, RunningWorker, WorkerExited, encode, subject_of
from shared.logs import kv
from shared.signal_scope import SignalScope
from shared.transient import is_transient

log = logging.getLogger(__name__)
_PUBLISH_RETRY_S = 0.5
_ENDED_KEPT = 10_000  # ended workers remembered against a repeated start


@dataclass
class _Running:
    record: WorkerRecord  # with both pids
    proc: subprocess.Popen[bytes] | None  # our child stepd; None when re-adopted
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # stepd is gone
    watcher: asyncio.Task[None] | None = None


class NodeExecutor:
    def __init__(
        self,
        bus: Bus,
        node: str,
        *,
        allow_root: bool,
        spool_root: str,
        state_folder: Path,
        boot_id: str,
        fence_s: float,
        grace_s: float,
        trusted_keys: TrustedKeys,
        accounts: AccountPolicy | None = None,
        address: str = "127.0.0.1",
        isolation: NodeIsolation | None = None,
    ) -> None:
        self.bus = bus
        self.isolation = isolation or NodeIsolation()  # cgroups and hooks (isolation.py)
        self.address = address  # this node's own address: rendezvous ports are bound on it
        self.spool_root = spool_root
        self.spool = Spool(spool_root)
        # Only what the launcher signed runs or is stopped here (shared/agent_auth.py),
        # and never as a system account (accounts.py).
        self.trusted_keys = trusted_keys
        self.accounts = accounts or AccountPolicy(allow_root=allow_root)
        self.node = node
        self.allow_root = allow_root
        self.table = WorkerTable(state_folder)
        self.boot_id = boot_id
        self.fence_s = fence_s
        self.grace_s = grace_s
        self.running: dict[int, _Running] = {}
        # (job, attempt, generation) of workers that ended here: a repeated start of one
        # (a new launcher owner resuming a start it cannot know finished) must not run
        # the generation twice. Kept on disk, as the next two (kept.py): an agent
        # SIGKILLed and restarted still knows them.
        self._ended = KeptKeys(self.table.state / "kept" / "ended", _ENDED_KEPT)
        # Generations stopped by the launcher, whether or not they ran here: a start that
        # arrives after its stop (delayed on the bus, or still in flight when the run
        # ended) must not run them (invariant 7; chaos seed 308).
        self._stopped = KeptKeys(self.table.state / "kept" / "stopped", _ENDED_KEPT)
        # Starts asked and not answered yet, run one at a time (`_start_lock`); `status`
        # lists them, so the launcher waits out a slow prolog (and the starts queued
        # behind it) instead of taking a start it has not heard back from for lost.
        self._starting: Counter[tuple[int, int, int]] = Counter()
        self._start_lock = asyncio.Lock()
        # The start under way (one at a time) and its stepd, from the moment stepd has
        # the spec until it says the worker runs: a stop or `shutdown` meanwhile (a slow
        # prolog) goes to stepd, which then never spawns the worker.
        self._launching: tuple[WorkerRecord, Stepd] | None = None
        self._closing = False  # `shutdown` began: nothing more starts here
        self._tasks: set[asyncio.Task[None]] = set()
        self.steps = StepRunner(self)  # srun's tasks inside running jobs (steps_agent.py)
        self.zygote = Zygote()  # forks each worker's stepd (stepd_client.py)

    def touch_contact(self) -> None:
        """The control plane was reached just now: every stepd's fence starts again."""
        touch(self.table.contact)

    def running_workers(self) -> tuple[RunningWorker, ...]:
        return tuple(
            RunningWorker(job_id=job, attempt=r.record.attempt, generation=r.record.generation)
            for job, r in sorted(self.running.items())
        )

    async def adopt(self) -> None:
        """At start: take over the workers a previous agent left, report those that ended,
        wait again on the srun step tasks it left in the jobs adopted (each under its own
        stepd, a `--pty` one's terminal relayed again), and end the rest, and every
        `--pty` task an agent before round 16 ran as its own child (the worker table's
        `tasks/` notes)."""
        records = [self.table.with_pids(found) for found in self.table.records()]
        left = [task for record in records for task in self.table.tasks_left(record)]
        if left:
            log.warning("ending step tasks an earlier agent left", extra=kv(tasks=len(left)))
            self._own(end_left_tasks(left))
        for record in records:
            verdict = judge(self.table.facts(record, self.boot_id))
            log.info(
                "worker record",
                extra=kv(job=record.job_id, attempt=record.attempt, verdict=str(verdict)),
            )
            if verdict is Verdict.ADOPT:
                self._track(_Running(record, proc=None))
                continue
            self._ended.add((record.job_id, record.attempt, record.generation))  # ran
            ending = self.table.exit_of(record) if verdict is Verdict.REPORT else None
            if verdict is Verdict.KILL_ORPHAN:  # sent now, before any start is served
                kill_group(record.worker, _signal.SIGKILL, record.cgroup)
            self._own(self._report(record, ending or lost_exit()))
        self.steps.resume()

    async def serve(self) -> None:
        prefix = f"{AGENT_PREFIX}{self.node}."
        await self.bus.serve(prefix + "start", self.node, self._on_start, concurrent=True)
        await self.bus.serve(prefix + "stop", self.node, self._on_stop)
        await self.bus.serve(prefix + "status", self.node, self._on_status)
        await self.bus.serve(prefix + "port", self.node, self._on_port)
        await self.steps.serve()
        self.zygote.warm()

    async def shutdown(self, grace_s: float) -> None:
        """Agent stopping: workers are left running only if we are killed; on a clean
        stop they get SIGTERM and `grace_s` like a drained node, the one a start under
        way (a prolog running) brings included: no later start begins."""
        self._closing = True
        if self._launching is not None:  # its prolog may take a while: no worker after it
            self._launching[1].stop()
        with contextlib.suppress(TimeoutError):  # past it, the start is cancelled with
            async with asyncio.timeout(grace_s + 5.0):  # the bus's requests (its
                await self._start_lock.acquire()  # stepd killed) and nothing runs on
                self._start_lock.release()
        await asyncio.gather(
            *(self._terminate(r, grace_s) for r in list(self.running.values())),
            return_exceptions=True,
        )
        await self.steps.close()
        await asyncio.to_thread(self.zygote.close)
        tasks = list(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s + 5.0)
            for task in pending:  # an exit not reported yet stays on disk for next start
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def fence_all(self) -> None:
        """The control plane was out of reach past fence_s: stop every worker. Each
        stepd does so itself; this covers one that hung along with us."""
        runs = list(self.running.values())
        if runs:
            log.warning("fencing workers", extra=kv(node=self.node, jobs=len(runs)))
        await asyncio.gather(*(self._terminate(r, self.grace_s) for r in runs))

    # --- start ------------------------------------------------------------------------

    async def _on_start(self, payload: bytes, _subject: str) -> bytes:
        spec = msgspec.json.decode(payload, type=WorkerSpec)
        if (refused := self.refused(spec)) is not None:  # before anything: no record,
            return msgspec.json.encode(refused)  # no spool, no process, not listed
        key = (spec.job_id, spec.attempt, spec.generation)
        self._starting[key] += 1
        try:
            async with self._start_lock:  # one start at a time, in the order asked
                if self._closing:  # no answer for the launcher: it requeues, and does
                    return msgspec.json.encode(  # not hold it against the node
                        AgentReply(ok=False, answered=False, message=f"{self.node}: stopping")
                    )
                return msgspec.json.encode(await self.start(spec))
        finally:
            self._starting[key] -= 1
            if not self._starting[key]:
                del self._starting[key]

    def refused(self, body: WorkerSpec | StopWorkers) -> AgentReply | None:
        """A refusal unless the launcher signed exactly this request for this node."""
        trusted = self.trusted_keys.current()
        refusal = check(body, node=self.node, trusted=trusted, now=time.time())
        if refusal is None:
            return None
        log.warning(
            "request refused",
            extra=kv(job=body.job_id, code=str(refusal.code), signer=body.token and body.token.key),
        )
        return AgentReply(ok=False, message=f"node {self.node} {refusal.message}")

    async def start(self, spec: WorkerSpec) -> AgentReply:
        """Run `spec`'s worker here; its grant was checked once, on arrival (`_on_start`),
        so a start queued behind a slow prolog is not refused for the wait."""
        current = self.running.get(spec.job_id)
        if current is not None:
            mine = (current.record.attempt, current.record.generation)
            if mine == (spec.attempt, spec.generation):
                return AgentReply(ok=True, message="already running")
            await self._terminate(current, 2.0)
        key = (spec.job_id, spec.attempt, spec.generation)
        if key in self._ended:
            return AgentReply(ok=True, message="already ran")
        if key in self._stopped:
            return AgentReply(ok=True, message="stopped before it started")
        try:
            run, never = await self._launch(spec)
        except (LaunchError, OSError) as err:
            self.spool.remove(spec.job_id, spec.attempt, spec.generation)
            log.warning("worker did not start", extra=kv(job=spec.job_id, error=str(err)))
            if isinstance(err, PrologFailed):  # Slurm's rule: requeue, drain the node
                self._own(self._drain(err.reason, "prolog"))
            return AgentReply(ok=False, message=str(err))
        self._track(run)
        worker = run.record.worker
        if worker is None:  # stepd was stopped (or fenced) while the prolog ran
            why = f"{never.ending if never is not None else 'stopped'} before its worker began"
            log.info(why, extra=kv(job=spec.job_id))
            return AgentReply(ok=True, message=why)
        log.info("worker started", extra=kv(job=spec.job_id, gen=spec.generation, pid=worker.pid))
        if key in self._stopped:  # its stop came while it was starting
            await self._terminate(run, self.grace_s)
            return AgentReply(ok=True, message="stopped as it started")
        return AgentReply(ok=True, message=f"pid {worker.pid}")

    async def _launch(self, spec: WorkerSpec) -> tuple[_Running, StepExit | None]:
        """Record the worker, start its stepd, wait until it says the worker runs; and
        how it ended, when stepd said that first (stopped or fenced during the prolog)."""
        run_as = job_account(spec.run_as, self.accounts)
        spool = self._spool(spec, run_as.uid if run_as else None)
        folder = self.table.folder(spec.job_id, spec.attempt, spec.generation)
        record = WorkerRecord(
            job_id=spec.job_id,
            attempt=spec.attempt,
            generation=spec.generation,
            boot_id=self.boot_id,
            folder=str(folder),
            spool=spool,
        )
        self.table.save(record)  # before stepd exists: a record for everything that may run
        write_struct(folder / "spec.json", self._step(spec, run_as, spool))
        outcome: StepStarted | StepExit | None = None
        stepd: Stepd | None = None
        try:
            stepd = await self.zygote.take(folder)
            if (ref := stepd.ref or process_ref(stepd.pid)) is not None:
                # on record from now: an agent restarted while its prolog runs adopts it
                # (and stops it, if asked) where it would report it lost and let it run
                record = msgspec.structs.replace(record, stepd=ref)
                self.table.save(record)
            self._launching = (record, stepd)
            if self._closing or (spec.job_id, spec.attempt, spec.generation) in self._stopped:
                stepd.stop()  # a stop that came while stepd was being forked
            outcome = await started_or_ended(folder, stepd, self._start_budget_s())
        finally:
            self._launching = None
            if outcome is None:  # no word from stepd: nothing of this start may run on
                if stepd is not None:  # first, so it spawns nothing after the look below
                    stepd.kill()
                started = self.table.started(record)
                if started is not None:
                    kill_group(started.worker, _signal.SIGKILL, started.cgroup)
                self.table.remove(record)
        if isinstance(outcome, StepExit) and outcome.spawn_failed:
            self.table.remove(record)
            failure = PrologFailed if outcome.prolog_failed else LaunchError
            raise failure(outcome.spawn_failed)
        # stepd's word that the worker runs, read once; read again only after an exit,
        # which may have come with a start that was not there at the first look
        started = outcome if isinstance(outcome, StepStarted) else self.table.started(record)
        if started is not None:
            record = msgspec.structs.replace(
                record, stepd=started.stepd, worker=started.worker, cgroup=started.cgroup
            )
            self.table.save(record)
        ended = outcome if isinstance(outcome, StepExit) else None
        return _Running(record, proc=stepd.proc), ended

    def _start_budget_s(self) -> float:
        """How long stepd may take to say the worker runs: a start's own time, and the
        site prolog's timeout when there is one (it runs before the worker)."""
        iso = self.isolation
        return START_TIMEOUT_S + (iso.hook_timeout_s if iso.prolog else 0.0)

    def _step(self, spec: WorkerSpec, run_as: RunAs | None, spool: str) -> StepSpec:
        """What stepd runs: the spec with its spool folder filled in, and the fence."""
        return StepSpec(
            argv=tuple(self._fill(a, spool) for a in spec.argv),
            env={k: self._fill(v, spool) for k, v in spec.env.items()} | _client_env(),
            workdir=spec.workdir,
            stdout=spec.stdout,
            stderr=spec.stderr,
            run_as=run_as,
            allow_root=self.allow_root,
            append=True,  # every node (and restart) of a job adds to its files
            contact=str(self.table.contact),
            fence_s=self.fence_s,
            grace_s=self.grace_s,
            isolation=for_worker(
                self.isolation,
                job_id=spec.job_id,
                attempt=spec.attempt,
                generation=spec.generation,
                node_name=self.node,
                env=spec.env,
                limits=spec.limits,
            ),
        )

    def _spool(self, spec: WorkerSpec, uid: int | None) -> str:
        """Write the job's script in a fresh folder of this generation (spool.py):
        nothing the job's user could have placed there is followed or chowned."""
        return self.spool.write(
            spec.job_id, spec.attempt, spec.generation, spec.script_name, spec.script, uid
        )

    # --- watching and reporting ---------------------------------------------------------

    def _own(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _track(self, run: _Running) -> None:
        self.running[run.record.job_id] = run
        run.watcher = self._own(self._watch(run))

    async def _watch(self, run: _Running) -> None:
        record = run.record
        proc, stepd = run.proc, record.stepd
        if proc is not None:
            await process_gone(proc.pid, lambda: proc.poll() is None)
        elif stepd is not None:
            await process_gone(stepd.pid, lambda: alive(stepd))
        ending = self.table.exit_of(record)
        if ending is None:  # stepd killed under its worker: nobody supervises it now
            found = self.table.with_pids(record)
            await killed(found.worker, found.cgroup)  # reported once gone, not signalled
            ending = lost_exit()
        if ending.epilog_failed:
            self._own(self._drain(ending.epilog_failed, "epilog"))
        run.ended.set()
        await self.steps.end_job(record.job_id)  # a step never outlives its job, nor holds
        # its GPUs past the exit reported (the launcher then frees them for another job)
        self._ended.add((record.job_id, record.attempt, record.generation))
        current = self.running.get(record.job_id)
        if current is run:
            del self.running[record.job_id]
        await self._report(record, ending)

    async def _drain(self, reason: str, hook: str) -> None:
        """A site hook failed here: ask the health monitor to drain this node (as an
        operator would), once; a refusal (a bus without the permission) is logged."""
        event = NodeHookFailed(node=self.node, hook=hook, reason=reason)
        try:
            await self.bus.publish_raw(subject_of(event), encode(event), str(event.event_id), {})
        except Exception as err:
            if not is_transient(err):
                raise
            log.error("cannot ask for this node's drain", extra=kv(reason=reason, error=repr(err)))
            return
        log.warning("node drain requested", extra=kv(node=self.node, reason=reason))

    async def _report(self, record: WorkerRecord, ending: StepExit) -> None:
        await gone(record.worker)  # a killed orphan: reported (its GPUs freed) once gone
        event = WorkerExited(
            job_id=record.job_id,
            attempt=record.attempt,
            node=self.node,
            exit_code=ending.exit_code,
            signal=ending.signal,
            oom_killed=ending.oom_killed,
            generation=record.generation,
            spawn_failed=ending.spawn_failed,
            mem_peak_bytes=ending.mem_peak_bytes,
            cpu_usec=ending.cpu_usec,
            lost=ending.ending is Ending.LOST,
            fenced=ending.ending is Ending.FENCED,
        )
        msg_id = f"exit-{record.job_id}-{record.attempt}-{record.generation}-{self.node}"
        while True:
            try:
                await self.bus.publish_raw(subject_of(event), encode(event), msg_id, {})
                break
            except Exception as err:
                if not is_transient(err):  # e.g. JetStream not answering yet after a restart
                    raise
                log.warning("cannot report worker exit yet", extra=kv(error=repr(err)))
                await asyncio.sleep(_PUBLISH_RETRY_S)
        log.info("worker exit reported", extra=kv(job=record.job_id, ending=str(ending.ending)))
        if record.cgroup is not None:  # stepd was killed before it removed it
            await asyncio.to_thread(cgroups.remove, record.cgroup)
        self.table.remove(record)
        self.spool.remove_folder(record.spool)  # the job ended: its script goes too

    # --- stop and status ----------------------------------------------------------------

    def _signal(self, run: _Running, sig: int, *, leader_only: bool = False) -> None:
        """Signal the worker's group (or its script alone) while its stepd still runs:
        after that the group id may be reused, so it is never signalled again."""
        if run.ended.is_set():
            return
        found = self.table.with_pids(run.record)
        worker = found.worker
        if worker is None:  # not spawned yet (an adopted start, its prolog running):
            if self.table.exit_of(run.record) is not None:  # nor ever will be: its stepd
                return  # runs the epilog, and is left to end it
            if not leader_only and alive(found.stepd) and found.stepd is not None:
                with contextlib.suppress(ProcessLookupError):  # stepd keeps a stop for
                    os.kill(found.stepd.pid, sig)  # its worker (SIGKILL: none is spawned)
            return
        if leader_only:
            if alive(worker) and worker is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.pid, sig)
            return
        kill_group(worker, sig, found.cgroup)

    async def _terminate(self, run: _Running, grace_s: float) -> None:
        """SIGTERM to the group; SIGKILL to whatever is left after `grace_s`."""
        self._signal(run, _signal.SIGTERM)
        try:
            await asyncio.wait_for(run.ended.wait(), timeout=grace_s)
        except TimeoutError:
            self._signal(run, _signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.ended.wait(), timeout=10.0)

    async def _on_stop(self, payload: bytes, _subject: str) -> bytes:
        req = msgspec.json.decode(payload, type=StopWorkers)
        if (refused := self.refused(req)) is not None:
            return msgspec.json.encode(refused)
        if req.wait and req.attempt is not None and req.generation is not None:
            self._stopped.add((req.job_id, req.attempt, req.generation))
        current = self.running.get(req.job_id)
        if current is None and req.wait and (launching := self._launching) is not None:
            record, stepd = launching
            if record.job_id == req.job_id and aimed_at(req, record):
                stepd.stop()  # kept by stepd: the worker is never spawned (or, spawned
                message = "stopped before its worker began"  # that instant, stopped)
                return msgspec.json.encode(AgentReply(ok=True, message=message))
        if current is None:
            return msgspec.json.encode(AgentReply(ok=True, message="not running"))
        if not aimed_at(req, current.record):
            return msgspec.json.encode(AgentReply(ok=True, message="another worker runs"))
        # `B:SIGUSR1` (from `--signal=B:USR1`): the job's script only, not its group.
        leader_only, _, name = req.signal.rpartition(":")
        sig = _signal.Signals[name] if name.startswith("SIG") else _signal.SIGTERM
        if not req.wait:  # a signal alone: to the worker, the job's step tasks, or both
            if req.scope is not SignalScope.STEPS:
                self._signal(current, sig, leader_only=leader_only == "B")
            tasks = (
                self.steps.signal_job(req.job_id, sig) if req.scope is not SignalScope.WORKER else 0
            )
            said = f"sent {sig.name}" + (f" to {tasks} step task(s)" if tasks else "")
            return msgspec.json.encode(AgentReply(ok=True, message=said))
        if sig != _signal.SIGTERM:
            self._signal(current, sig)
        steps = self.steps.end_job(req.job_id, req.grace_s)  # with the worker, not after
        await asyncio.gather(self._terminate(current, req.grace_s), steps)
        if current.watcher is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(current.watcher), timeout=5.0)
        return msgspec.json.encode(AgentReply(ok=True, message="stopped"))

    def _fill(self, text: str, spool: str) -> str:
        """The placeholders only this node can fill: its spool folder and its address."""
        return fill_on_node(text, spool=spool, address=self.address)

    async def _on_port(self, _payload: bytes, _subject: str) -> bytes:
        """A port free on this node, for a rendezvous it will host (rank 0's c10d store):
        only the node can know which of its ports are free."""
        return msgspec.json.encode(AgentReply(ok=True, port=free_port(self.address)))

    async def _on_status(self, _payload: bytes, _subject: str) -> bytes:
        alive_ = tuple((w.job_id, w.attempt, w.generation) for w in self.running_workers())
        starting = tuple(sorted(self._starting))
        steps = self.steps.listed()
        reply = AgentReply(ok=True, workers=alive_, starting=starting, steps=steps)
        return msgspec.json.encode(reply)


def aimed_at(req: StopWorkers, record: WorkerRecord) -> bool:
    """Whether a stop names this worker: by job alone, or also by attempt/generation."""
    if req.attempt is not None and req.attempt != record.attempt:
        return False
    return req.generation is None or req.generation == record.generation


def _client_env() -> dict[str, str]:
    """What a job's own `srun` needs to reach the cluster: the bus this agent uses
    (docs/steps.md). The launcher strips every inherited MUSTER_ variable."""
    url = os.environ.get("MUSTER_NATS_URL", "")
    return {"MUSTER_NATS_URL": url} if url else {}
