"""Node shell: the tasks of job steps (srun) on this node (docs/steps.md).

`muster.agent.<node>.step` carries a `StepLaunch` the launcher signed (verb "step",
shared/agent_auth.py). A step runs only inside a job whose worker this agent runs now,
with the same allocation attempt and generation: its tasks are started as the job's
user, inside the job's cgroup when it has one (so the job's memory, CPU and device
limits hold them), each in its own process group. The reply comes once every task here
ended. When the job's worker ends (it finished, was cancelled, hit its time limit or
was fenced) the agent ends its steps too (`end_job`): a step never outlives its job.

A step is known here by (job, attempt, generation, step id) while it runs and for
`KEEP_S` after: the same launch again (the launcher retried, or another replica took
the step over and sends it with `adopt`) waits on the step already running, or gets
its outcome at once; it never starts the step twice. An `adopt` of a step this agent
does not know (it restarted) answers that the step is lost.

Each task is noted in its job's worker folder while it runs (`WorkerTable.add_task`):
it is this agent's child, so an agent killed leaves it running with nobody to report
or end it. The next agent ends every task still alive (`end_left_tasks`) before it
serves, so a step the launcher records lost runs no more, and none outlives its job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import signal as _signal
import time
from collections.abc import Coroutine, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from services.launcher import cgroups
from services.launcher.accounts import AccountPolicy, job_account
from services.launcher.executor import LaunchError, Worker, process_gone, spawn_worker
from services.launcher.steps_pty import relay, spawn_on_pty
from services.launcher.worker_table import (
    ProcessRef,
    WorkerRecord,
    WorkerTable,
    alive,
    kill_group,
    process_ref,
)
from shared.agent_auth import TrustedKeys, check
from shared.api import AGENT_PREFIX, StepLaunch, StepOutcome, StepStop
from shared.bus import Bus
from shared.logs import kv

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)
END_GRACE_S = 5.0  # SIGTERM, then SIGKILL, for a step whose job ended
KEEP_S = 600.0  # how long an ended step's outcome is kept for a launcher that asks again
StepKey = tuple[int, int, int, int]  # job, attempt, generation, step id


class NodeExecutor(Protocol):
    """What steps need of the node agent (agent.py's NodeExecutor)."""

    node: str
    bus: Bus
    trusted_keys: TrustedKeys
    accounts: AccountPolicy
    allow_root: bool
    table: WorkerTable

    @property
    def running(self) -> Mapping[int, Any]: ...  # job -> its worker (record, ended)


class StepRunner:
    def __init__(self, executor: NodeExecutor) -> None:
        self.executor = executor
        self.workers: dict[int, set[Worker]] = {}  # job -> its step tasks running here
        self.folders: dict[Worker, str] = {}  # task -> its step's output folder (srun's)
        self.notes: dict[Worker, Path] = {}  # task -> its note in the job's worker folder
        self._tasks: set[asyncio.Task[None]] = set()
        self.live: dict[StepKey, asyncio.Future[StepOutcome]] = {}  # steps running here
        self.ended: dict[StepKey, tuple[float, StepOutcome]] = {}  # (monotonic end, outcome)

    async def serve(self) -> None:
        """Each step in its own task: a step lasts as long as its command, and other
        steps (and other jobs') must not wait for it."""
        subject = f"{AGENT_PREFIX}{self.executor.node}.step"

        async def on_request(msg: Msg) -> None:
            task = asyncio.get_running_loop().create_task(self._answer(msg))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        await self.executor.bus.nc.subscribe(subject, queue=self.executor.node, cb=on_request)
        await self.executor.bus.serve(subject + "_stop", self.executor.node, self._on_stop)

    async def _on_stop(self, payload: bytes, _subject: str) -> bytes:
        """srun was interrupted: end that step's tasks here (its request then answers)."""
        try:
            stop = msgspec.json.decode(payload, type=StepStop)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            return msgspec.json.encode(StepOutcome(ok=False, message=f"malformed: {err}"))
        ex = self.executor
        refusal = check(stop, node=ex.node, trusted=ex.trusted_keys.current(), now=time.time())
        if refusal is not None:
            return msgspec.json.encode(StepOutcome(ok=False, message=refusal.message))
        ending = [
            w for w in self.workers.get(stop.job_id, ()) if self.folders.get(w) == stop.output_dir
        ]
        for worker in ending:
            self._spawn(_end(worker, stop.grace_s))
        return msgspec.json.encode(StepOutcome(ok=True, message=f"ending {len(ending)} task(s)"))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            launch = msgspec.json.decode(msg.data, type=StepLaunch)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            outcome = StepOutcome(ok=False, message=f"malformed step: {err}")
        else:
            outcome = await self.outcome_of(launch)
        if msg.reply:
            with contextlib.suppress(Exception):  # the launcher is gone: nobody to tell
                await msg.respond(msgspec.json.encode(outcome))

    async def outcome_of(self, launch: StepLaunch) -> StepOutcome:
        """The step's outcome: run it, or wait on (or read) the one already known."""
        ex = self.executor
        refusal = check(launch, node=ex.node, trusted=ex.trusted_keys.current(), now=time.time())
        if refusal is not None:  # before anything is looked up: only the launcher may ask
            return StepOutcome(ok=False, message=f"node {ex.node} {refusal.message}")
        key = (launch.job_id, launch.attempt, launch.generation, launch.step_id)
        if key in self.ended:
            return self.ended[key][1]
        if key in self.live:
            return await asyncio.shield(self.live[key])
        if launch.adopt:
            step = f"step {launch.job_id}.{launch.step_id}"
            return StepOutcome(ok=False, message=f"{step} is not known on {ex.node}: lost")
        future: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        self.live[key] = future
        outcome = StepOutcome(ok=False, message=f"the step's supervision on {ex.node} ended")
        try:
            outcome = await self.run(launch)
        finally:
            self.live.pop(key, None)
            self._keep(key, outcome)
            future.set_result(outcome)
        return outcome

    def _keep(self, key: StepKey, outcome: StepOutcome) -> None:
        now = time.monotonic()
        for old in [k for k, (at, _) in self.ended.items() if now - at > KEEP_S]:
            del self.ended[old]
        self.ended[key] = (now, outcome)

    def refused(self, launch: StepLaunch) -> str | None:
        ex = self.executor
        refusal = check(launch, node=ex.node, trusted=ex.trusted_keys.current(), now=time.time())
        if refusal is not None:
            return f"node {ex.node} {refusal.message}"
        current = ex.running.get(launch.job_id)
        if current is None or current.ended.is_set():
            return f"job {launch.job_id} runs no worker on {ex.node}: a step runs inside its job"
        mine = (current.record.attempt, current.record.generation)
        if mine != (launch.attempt, launch.generation):
            return f"job {launch.job_id} on {ex.node} runs another start than the step's"
        return None

    async def run(self, launch: StepLaunch) -> StepOutcome:
        if (refusal := self.refused(launch)) is not None:
            log.warning("step refused", extra=kv(job=launch.job_id, reason=refusal))
            return StepOutcome(ok=False, message=refusal)
        ex = self.executor
        record = ex.running[launch.job_id].record
        hierarchy = cgroups.detect() if record.cgroup is not None else None
        started: list[Worker] = []
        mine = self.workers.setdefault(launch.job_id, set())
        if launch.pty:
            return await self._run_pty(launch, record, mine)
        try:
            run_as = job_account(launch.run_as, ex.accounts)
            for task in launch.tasks:
                worker = await spawn_worker(
                    launch.argv,
                    task.env,
                    launch.workdir,
                    task.stdout,
                    task.stderr,
                    run_as,
                    allow_root=ex.allow_root,
                    cgroup=record.cgroup,
                    hierarchy=hierarchy,
                )
                # Inside the job's cgroup (its limits hold the task), but the task owns
                # only its own process group: its end must never kill the job's cgroup.
                worker.cgroup = None
                started.append(worker)
                mine.add(worker)
                self.folders[worker] = posixpath.dirname(task.stdout)
                self._note(record, worker)
        except (LaunchError, OSError) as err:
            await asyncio.gather(*(w.terminate(0.0) for w in started), return_exceptions=True)
            self._forget(launch.job_id, started)
            return StepOutcome(ok=False, message=f"step did not start on {ex.node}: {err}")
        log.info(
            "step started",
            extra=kv(job=launch.job_id, step=launch.step_id, tasks=len(started), node=ex.node),
        )
        try:
            ends = await asyncio.gather(*(w.wait() for w in started))
        finally:
            self._forget(launch.job_id, started)
        return StepOutcome(
            ok=True,
            exit_codes=tuple(e.exit_code for e in ends),
            signals=tuple(e.signal for e in ends),
        )

    async def _run_pty(
        self, launch: StepLaunch, record: WorkerRecord, mine: set[Worker]
    ) -> StepOutcome:
        """`srun --pty`: its one task on a terminal relayed over the bus (steps_pty.py)."""
        ex = self.executor
        task = launch.tasks[0]
        try:
            run_as = job_account(launch.run_as, ex.accounts)
            worker, master = spawn_on_pty(
                launch.argv, task.env, launch.workdir, run_as, record.cgroup
            )
        except (LaunchError, OSError, cgroups.CgroupError) as err:
            self._forget(launch.job_id, [])
            return StepOutcome(ok=False, message=f"step did not start on {ex.node}: {err}")
        mine.add(worker)
        self.folders[worker] = posixpath.dirname(task.stdout)
        self._note(record, worker)
        log.info("pty step started", extra=kv(job=launch.job_id, step=launch.step_id))
        try:
            await relay(ex.bus, launch.pty, master, worker)
            end = await worker.wait()
        finally:
            self._forget(launch.job_id, [worker])
        return StepOutcome(ok=True, exit_codes=(end.exit_code,), signals=(end.signal,))

    def _note(self, record: WorkerRecord, worker: Worker) -> None:
        """Note the task in its job's worker folder, for an agent that follows this one.
        A note that cannot be written (the job's folder just went with its end) is
        logged: the task itself is ended with its job by this agent."""
        ref = process_ref(worker.pid, zombie_ok=True)
        if ref is None:
            return
        try:
            self.notes[worker] = self.executor.table.add_task(record, ref)
        except OSError as err:
            log.warning("step task not noted", extra=kv(job=record.job_id, error=str(err)))

    def _forget(self, job_id: int, workers: list[Worker]) -> None:
        mine = self.workers.get(job_id, set())
        mine.difference_update(workers)
        for worker in workers:
            self.folders.pop(worker, None)
            note = self.notes.pop(worker, None)
            if note is not None:
                note.unlink(missing_ok=True)
        if not mine:
            self.workers.pop(job_id, None)

    def end_job(self, job_id: int) -> None:
        """The job's worker ended here: its steps' tasks end too."""
        for worker in list(self.workers.get(job_id, ())):
            self._spawn(_end(worker, END_GRACE_S))

    async def close(self) -> None:
        for job_id in list(self.workers):
            self.end_job(job_id)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=END_GRACE_S + 5.0)


async def _end(worker: Worker, grace_s: float) -> None:
    await worker.terminate(grace_s)


async def end_left_tasks(tasks: list[ProcessRef], grace_s: float = END_GRACE_S) -> None:
    """End the step tasks an earlier agent left running (`WorkerTable.tasks_left`):
    SIGTERM to each one's process group, SIGKILL to those left after `grace_s`."""
    for task in tasks:
        kill_group(task, _signal.SIGTERM)
    gone = [process_gone(task.pid, partial(alive, task)) for task in tasks]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*gone), grace_s)
    for task in tasks:
        kill_group(task, _signal.SIGKILL)
