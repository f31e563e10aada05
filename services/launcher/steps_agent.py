"""Node shell: the tasks of job steps (srun) on this node (docs/steps.md).

`muster.agent.<node>.step` carries a `StepLaunch` the launcher signed (verb "step",
shared/agent_auth.py). A step runs only inside a job whose worker this agent runs now,
with the same allocation attempt and generation: its tasks are started as the job's
user, inside the job's cgroup when it has one (so the job's memory, CPU and device
limits hold them), each in its own process group. The reply comes once every task here
ended. When the job's worker ends (it finished, was cancelled, hit its time limit or
was fenced) the agent ends its steps too (`end_job`): a step never outlives its job.
A stop ends them with the worker, and the worker's exit is reported (a stop answered)
only once they ended: the job's GPUs are freed for another job only then.

A step is known here by (job, attempt, generation, step id) while it runs and for
`KEEP_S` after: the same launch again (the launcher retried, or another replica took
the step over and sends it with `adopt`) waits on the step already running, or gets
its outcome at once; it never starts the step twice. An `adopt` of a step this agent
does not know answers that the step is lost.

A stop (srun's Ctrl-C) is kept, by job and folder, for `KEEP_S` too, on disk (kept.py:
the next agent knows it after a kill -9): an srun
interrupted while its request was in flight sends its stop before the launcher made
the step, or before the launch reached this node, or while its tasks were being
started. Such a launch starts nothing and is answered as stopped (the step is
CANCELLED), and a task started after the stop is ended at once: a step never runs on
for an srun that is gone.

Each task runs under a stepd of its own (step_tasks.py), as a worker does, so it
outlives the agent: a restarted agent finds its job's tasks (`resume`) and waits on
them again. Such a step is not listed in `status` until a launcher asks for it: the
launcher, whose request went to the agent that died, sees it missing and asks again
with `adopt`, which waits for the step's end. Tasks of a job whose worker did not
survive are stopped. A `--pty` task's terminal is its stepd's too (pty_task.py): the
agent relays it (steps_pty.py), and the next agent relays it again, the output printed
meanwhile first.
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
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from services.launcher.accounts import AccountPolicy, job_account
from services.launcher.executor import LaunchError, RunAs, process_gone
from services.launcher.kept import KeptOutcomes, KeptStops
from services.launcher.pty_task import SOCKET
from services.launcher.step_tasks import StepKey, StepTask, TaskFolders, TaskNote
from services.launcher.stepd_client import Zygote, started_or_ended
from services.launcher.steps_core import bad_end
from services.launcher.steps_pty import relay
from services.launcher.worker_table import (
    Ending,
    ProcessRef,
    StepExit,
    StepSpec,
    WorkerRecord,
    WorkerTable,
    alive,
    kill_group,
)
from shared.agent_auth import TrustedKeys, check
from shared.api import AGENT_PREFIX, StepLaunch, StepOutcome, StepStop, StepTaskSpec
from shared.bus import Bus
from shared.logs import kv
from shared.waits import first_where

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)
END_GRACE_S = 5.0  # SIGTERM, then SIGKILL, for a step whose job ended
KEEP_S = 600.0  # how long an ended step's outcome is kept for a launcher that asks again


class NodeExecutor(Protocol):
    """What steps need of the node agent (agent.py's NodeExecutor)."""

    node: str
    bus: Bus
    trusted_keys: TrustedKeys
    accounts: AccountPolicy
    allow_root: bool
    table: WorkerTable
    zygote: Zygote
    fence_s: float

    @property
    def running(self) -> Mapping[int, Any]: ...  # job -> its worker (record, ended)


class StepRunner:
    def __init__(self, executor: NodeExecutor) -> None:
        self.executor = executor
        self.task_folders = TaskFolders(executor.table.state)
        self.workers: dict[int, set[StepTask]] = {}  # job -> its step tasks running here
        self.folders: dict[StepTask, str] = {}  # task -> its step's output folder (srun's)
        self._tasks: set[asyncio.Task[None]] = set()
        self.live: dict[StepKey, asyncio.Future[StepOutcome]] = {}  # steps running here
        self.ended: dict[StepKey, tuple[float, StepOutcome]] = {}  # (monotonic end, outcome)
        # how the steps' tasks here ended, also on disk for the next agent (kept.py)
        self.finished = KeptOutcomes(executor.table.state / "kept" / "step_outcomes", KEEP_S)
        # srun's stops, by (job, folder): a launch or task that comes later is stopped,
        # by this agent or the next (kept on disk, kept.py)
        self.stops = KeptStops(executor.table.state / "kept" / "step_stops", KEEP_S)
        # steps resumed from an earlier agent's tasks that no launcher asked for since
        # (not in `status`: their launcher then asks again, with `adopt`)
        self.unclaimed: set[StepKey] = set()

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
        """srun was interrupted: end that step's tasks here (its request then answers);
        or a signal for them alone."""
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
        if stop.signal:  # `scancel -s SIG JOB.STEP`: the tasks here get it and run on
            sent = sum(w.signal(stop.signal) for w in ending)
            return msgspec.json.encode(StepOutcome(ok=True, message=f"signalled {sent} task(s)"))
        self.stops.add(stop.job_id, stop.output_dir, stop.grace_s)
        for worker in ending:
            self._spawn(_end(worker, stop.grace_s))
        return msgspec.json.encode(StepOutcome(ok=True, message=f"ending {len(ending)} task(s)"))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        self.unclaimed.discard(key)
        if key in self.ended:
            return self.ended[key][1]
        if (finished := self.finished.get(key)) is not None:  # told by the agent before
            return finished
        if key in self.live:
            return await asyncio.shield(self.live[key])
        if launch.adopt:
            step = f"step {launch.job_id}.{launch.step_id}"
            return StepOutcome(ok=False, message=f"{step} is not known on {ex.node}: lost")
        return await self._as_live(key, self._open(key), self.run(launch))

    def _open(self, key: StepKey) -> asyncio.Future[StepOutcome]:
        """The step is live here from now on: asked again, it is waited on."""
        future: asyncio.Future[StepOutcome] = asyncio.get_running_loop().create_future()
        self.live[key] = future
        return future

    async def _as_live(
        self,
        key: StepKey,
        future: asyncio.Future[StepOutcome],
        work: Coroutine[Any, Any, StepOutcome],
    ) -> StepOutcome:
        """`work`'s outcome, kept for those who ask later (`_open` made it live)."""
        node = self.executor.node
        outcome = StepOutcome(ok=False, message=f"the step's supervision on {node} ended")
        try:
            outcome = await work
            if self.finished.get(key) is None:  # a refusal, a failed start, srun's stop:
                self.finished.add(key, outcome)  # on disk too, for the next agent's adopt
        finally:  # (cut short, the tasks' folders stay for the next agent to resume)
            self.live.pop(key, None)
            self.unclaimed.discard(key)
            self._keep(key, outcome)
            future.set_result(outcome)
        return outcome

    def listed(self) -> tuple[StepKey, ...]:
        """The steps `status` names: those running here that a launcher asked for."""
        return tuple(sorted(k for k in self.live if k not in self.unclaimed))

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
        started: list[StepTask] = []
        tasks = launch.tasks[:1] if launch.pty else launch.tasks  # a terminal: one task
        folder = posixpath.dirname(tasks[0].stdout) if tasks else ""
        if self._stop_for(launch.job_id, folder) is not None:
            log.info("step stopped before it started", extra=kv(job=launch.job_id))
            none = (None,) * len(tasks)
            return StepOutcome(
                ok=True,
                message=f"srun stopped the step before it started on {ex.node}",
                exit_codes=none,
                signals=none,
                stopped=(True,) * len(tasks),
            )
        try:
            run_as = job_account(launch.run_as, ex.accounts)
            for task in tasks:  # forked one by one, then started side by side
                one = await self._fork_task(launch, task, record, run_as)
                started.append(one)
                self._hold(launch.job_id, one)
            firsts = await asyncio.gather(
                *(started_or_ended(t.folder, t.stepd) for t in started), return_exceptions=True
            )
            for first in firsts:
                if isinstance(first, BaseException):
                    raise first
                if isinstance(first, StepExit) and first.ending is Ending.SPAWN_FAILED:
                    raise LaunchError(first.spawn_failed)
        except (LaunchError, OSError) as err:
            await asyncio.gather(*(t.terminate(0.0) for t in started), return_exceptions=True)
            self._forget(launch.job_id, started)
            return StepOutcome(ok=False, message=f"step did not start on {ex.node}: {err}")
        log.info(
            "step started",
            extra=kv(job=launch.job_id, step=launch.step_id, tasks=len(started), node=ex.node),
        )
        return await self._outcome(launch.job_id, started)

    async def _fork_task(
        self, launch: StepLaunch, task: StepTaskSpec, record: WorkerRecord, run_as: RunAs | None
    ) -> StepTask:
        """One task's folder, and a stepd (step_tasks.py) handed it: the task starts."""
        ex = self.executor
        note = TaskNote(
            job_id=launch.job_id,
            attempt=launch.attempt,
            generation=launch.generation,
            step_id=launch.step_id,
            procid=task.procid,
            output_dir=posixpath.dirname(task.stdout),
            pty=launch.pty,
            kill_on_bad_exit=launch.kill_on_bad_exit,
        )
        spec = StepSpec(
            argv=launch.argv,
            env=task.env,
            workdir=launch.workdir,
            stdout=task.stdout,
            stderr=task.stderr,
            run_as=run_as,
            allow_root=ex.allow_root,
            append=False,
            contact=str(ex.table.contact),
            fence_s=ex.fence_s,
            grace_s=END_GRACE_S,
            join_cgroup=record.cgroup,
            pty=bool(launch.pty),
            pty_window=launch.pty_window,
        )
        folder = self.task_folders.create(note, spec)
        try:
            stepd = await ex.zygote.take(folder)
        except LaunchError:
            TaskFolders.remove(folder)
            raise
        return StepTask.forked(folder, note, stepd)

    async def _outcome(self, job_id: int, tasks: list[StepTask]) -> StepOutcome:
        """Every task's end, in order (a terminal's relayed until then); their folders go
        once it is read (not before: a wait cut short leaves them to the next agent)."""
        bus = self.executor.bus
        terminals = [relay(bus, t.note.pty, t.folder / SOCKET) for t in tasks if t.note.pty]
        await asyncio.gather(*terminals)
        if len(tasks) > 1 and tasks[0].note.kill_on_bad_exit:
            await _first_bad_ends_the_rest(tasks)
        ends = await asyncio.gather(*(t.ended() for t in tasks))
        outcome = StepOutcome(
            ok=True,
            exit_codes=tuple(e.exit_code for e in ends),
            signals=tuple(e.signal for e in ends),
            stopped=tuple(e.ending in (Ending.STOPPED, Ending.FENCED) for e in ends),
            node_failed=tuple(e.ending in (Ending.FENCED, Ending.LOST) for e in ends),
        )
        if tasks:  # on disk before the folders go: the next agent can still answer
            self.finished.add(tasks[0].note.key, outcome)
        self._forget(job_id, tasks)
        return outcome

    def resume(self) -> None:
        """At the agent's start, once its workers are adopted: wait again on the batch
        tasks an earlier agent started, each step live and unclaimed (the module doc);
        stop those whose job runs no worker here now, or another start of it."""
        steps: dict[StepKey, list[StepTask]] = {}
        for folder, note in self.task_folders.found():
            task = StepTask.left(folder, note)
            if task is None:
                TaskFolders.remove(folder)
                continue
            if not self._runs_now(note):
                self._spawn(_end_left(task))
                continue
            steps.setdefault(note.key, []).append(task)
        for key, tasks in sorted(steps.items()):
            tasks.sort(key=lambda t: t.note.procid)
            for task in tasks:
                self._hold(key[0], task)
            self.unclaimed.add(key)
            work = self._outcome(key[0], tasks)
            self._spawn(_kept(self._as_live(key, self._open(key), work)))
            log.info("step resumed", extra=kv(job=key[0], step=key[3], tasks=len(tasks)))

    def _runs_now(self, note: TaskNote) -> bool:
        """The task's job runs here now, in the start the task was launched in."""
        current = self.executor.running.get(note.job_id)
        if current is None or current.ended.is_set():
            return False
        record = current.record
        return (record.attempt, record.generation) == (note.attempt, note.generation)

    def _hold(self, job_id: int, task: StepTask) -> None:
        self.workers.setdefault(job_id, set()).add(task)
        self.folders[task] = task.note.output_dir
        grace = self._stop_for(job_id, task.note.output_dir)
        if grace is not None:  # the stop came while the step's tasks were being started
            self._spawn(_end(task, grace))

    def _stop_for(self, job_id: int, folder: str) -> float | None:
        """The grace of a stop kept for the job's step writing under `folder`."""
        return self.stops.grace(job_id, folder)

    def _forget(self, job_id: int, tasks: list[StepTask]) -> None:
        mine = self.workers.get(job_id, set())
        mine.difference_update(tasks)
        for task in tasks:
            self.folders.pop(task, None)
            task.remove()
        if not mine:
            self.workers.pop(job_id, None)

    def signal_job(self, job_id: int, sig: int) -> int:
        """`sig` to every task of the job's steps here (each task's process group), as
        Slurm's `scancel -s` signals a job's steps; how many were signalled."""
        return sum(task.signal(sig) for task in self.workers.get(job_id, ()))

    async def end_job(self, job_id: int, grace_s: float = END_GRACE_S) -> None:
        """The job ends here: its steps' tasks end too (SIGTERM, SIGKILL after
        `grace_s`). Returns once they have: until then the job's GPUs are not free on
        this node, so its worker's exit (and a stop's answer) waits for this. The ends
        are owned by the runner: a caller cancelled leaves them running."""
        ending = [self._spawn(_end(task, grace_s)) for task in self.workers.get(job_id, ())]
        if ending:
            await asyncio.wait(ending)

    async def close(self) -> None:
        for job_id in list(self.workers):
            for task in self.workers[job_id]:
                self._spawn(_end(task, END_GRACE_S))
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=END_GRACE_S + 5.0)


async def _first_bad_ends_the_rest(tasks: list[StepTask]) -> None:
    """srun -K: once a task exits non-zero or by a signal, the others are stopped (their
    stepds: SIGTERM, SIGKILL after the grace); returns at the first bad end, or once
    every task ended well."""
    waits: dict[asyncio.Future[StepExit], StepTask] = {
        asyncio.ensure_future(t.ended()): t for t in tasks
    }
    try:
        left = await first_where(waits, lambda end: bad_end([end.exit_code], [end.signal]))
        if left is not None:
            log.info("a task ended badly: stopping the others", extra=kv(left=len(left)))
            for w in left:
                waits[w].stop()
    finally:  # done or cut short (the agent stopping): each task's own wait is shielded
        for w in waits:
            w.cancel()


async def _end(task: StepTask, grace_s: float) -> None:
    await task.terminate(grace_s)


async def _end_left(task: StepTask) -> None:
    """A task left by an earlier agent in a job that does not run here now: stopped
    (its stepd records the exit), its folder then gone."""
    await task.terminate(END_GRACE_S)
    task.remove()


async def _kept(work: Coroutine[Any, Any, StepOutcome]) -> None:
    await work


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
