"""Launcher shell: job steps (`srun` inside a job; docs/steps.md).

`muster.api.step` (queue group `launcher`, signed by the user like every API request)
asks to run a command on the nodes of a RUNNING job the caller owns. The launcher lays
the tasks out (`steps_core.layout`), records the step (`job_steps`, RUNNING), sends
every node its tasks as a `StepLaunch` it signs (the agents run only what it signs,
inside the job's current worker), waits for every node's answer, records how the step
ended and answers srun. A node that does not answer in the job's remaining time (plus
a margin) counts as lost and the step as CANCELLED.

A step outlives the replica that started it. Its waiting on the agents (`_coordinate`)
is a task of its own, under a lease on the step's row that it renews; srun's request
is answered when the step ends or after `ANSWER_S` with "RUNNING", and srun asks again
with the same request (its output folder names the step), which any replica answers
from the row. When a replica dies, its steps' leases run out and another replica's
sweep claims them and asks their agents again with `adopt` (docs/steps.md): the agents
answer with each step's outcome once its tasks end, and that replica records it.

While it waits on a node, the coordinator asks the node's `status` every `PROBE_S`
(an answer at most `PROBE_S / 2` old serves every step waiting on that node:
status_probe.py, so a node running many steps is not asked once for each).
An agent that answers but does not list the step is asked again with `adopt`: one
that was restarted found the step's tasks still running under their stepds and
answers when they end (their first request went to the agent that died), one that
never knew the step answers at once that it is lost, and one that has just ended it
answers with its outcome. Before the tasks had stepds, such a step was lost with its
agent; before the probe, it stayed RUNNING, and its srun waited, until the job's
time limit.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import os
import posixpath
import secrets
import signal as _signal
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from services.launcher import steps_repo as repo
from services.launcher.gang import Agents, dropped
from services.launcher.steps_core import (
    Busy,
    Layout,
    Refusal,
    StepEnd,
    StepShape,
    StepState,
    bad_end,
    layout,
    step_end,
    task_env,
    with_job_gpus,
    with_job_tasks,
)
from shared.api import (
    AGENT_PREFIX,
    API_PREFIX,
    Ok,
    StepCancelRequest,
    StepLaunch,
    StepOutcome,
    StepReply,
    StepRequest,
    StepStop,
    StepTaskSpec,
)
from shared.apiserve import Refused, enveloped
from shared.bus_inbox import is_users_pty, user_pty
from shared.db import outbox_add
from shared.events import JobNodeLost
from shared.identity import Verifier, authenticated
from shared.identity_files import IdentitySource
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import ServiceContext
from shared.settings import LauncherSettings
from shared.signal_scope import signal_name
from shared.states import JobState
from shared.transient import is_transient
from shared.waits import first_where

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)
VERB = "step"
CANCEL_VERB = "step_cancel"
QUEUE = "launcher"
ANSWER_S = 5.0  # srun's request is answered within this; RUNNING: ask again
POLL_S = 1.0  # how often a request for a step another replica coordinates reads its row
PROBE_S = 5.0  # how often a node a step waits on is asked whether it still runs the step


class StepService:
    def __init__(
        self,
        ctx: ServiceContext[LauncherSettings],
        agents: Agents,
        holder: str = "",
        lease_s: float = 2.0,
    ) -> None:
        self.ctx = ctx
        self.agents = agents
        settings = ctx.settings
        self.identity = IdentitySource(settings.cluster_config, settings.user_keys_dir)
        self.verifier = Verifier(self.identity.directory)
        self._tasks: set[asyncio.Task[None]] = set()
        # the coordinator's name on the rows (the shard holder's: unique per process)
        self.holder = holder or f"launcher-steps-{os.getpid()}-{secrets.token_hex(3)}"
        self.renew_s = lease_s
        self.lease_s = 3 * lease_s  # a few renewals missed before another replica adopts
        self._coordinating: dict[tuple[int, int], asyncio.Task[None]] = {}
        # past the job's time limit, a node's silence about a step means it is lost
        self.margin_s = settings.step_silence_s

    async def serve(self, stop: asyncio.Event) -> None:
        route = authenticated(self.verifier, API_PREFIX + VERB, StepRequest, self.run, time.time)
        handler = enveloped(route)

        async def on_request(msg: Msg) -> None:
            task = asyncio.get_running_loop().create_task(self._answer(msg, handler))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        sub = await self.ctx.bus.nc.subscribe(API_PREFIX + VERB, queue=QUEUE, cb=on_request)
        cancel = authenticated(
            self.verifier, API_PREFIX + CANCEL_VERB, StepCancelRequest, self.cancel, time.time
        )
        await self.ctx.bus.serve(API_PREFIX + CANCEL_VERB, QUEUE, enveloped(cancel))
        self._spawn(self._sweep(stop))
        try:
            await stop.wait()
        finally:
            await sub.unsubscribe()
            for task in list(self._tasks):  # their agents' tasks end with their jobs
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.verifier.aclose()

    async def _answer(self, msg: Msg, handler: Any) -> None:
        reply = await handler(msg.data, msg.subject)
        if msg.reply:
            try:
                await msg.respond(reply)
            except Exception as err:  # srun is gone (interrupted): nothing to tell
                log.warning("step reply not sent", extra=kv(error=repr(err)))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self, req: StepRequest) -> StepReply:
        if not req.argv:
            raise Refused("srun: no command to run")
        if req.pty and not is_users_pty(req.user, req.pty):  # the bus lets only its user in
            raise Refused(
                f"srun --pty: a terminal's subject must be {user_pty(req.user)}.<32 hex digits>"
                f" (yours, which only you and the agents may use), not {req.pty!r}",
                "invalid",
            )
        if req.output_dir:  # asked again: the step it started, wherever it is coordinated
            async with self.ctx.pool.acquire() as conn:
                known = await repo.step_by_folder(conn, req.job_id, req.output_dir)
            if known is not None:
                if req.user != known["user_name"]:
                    raise Refused(
                        f"job {req.job_id} belongs to {known['user_name']!r}", "forbidden"
                    )
                return await self._answer_when_ended(req.job_id, known["step_id"])
        async with self.ctx.pool.acquire() as conn:
            found = await repo.live_run(conn, req.job_id)
        if found is None:
            raise Refused(f"job {req.job_id} is not running: a step runs inside a running job")
        row, spec = found
        if req.user != spec.user:
            raise Refused(
                f"job {req.job_id} belongs to {spec.user!r}: only its owner runs steps in it",
                "forbidden",
            )
        if row["state"] == JobState.STARTING:  # a node's script may run before another's
            # worker started (an agent slow to answer): srun waits, as for held GPUs
            why = f"job {req.job_id} is starting: its workers do not run on every node yet"
            raise Refused(why, "busy")
        gpus: dict[str, list[int]] = json.loads(row["gpus"])
        shape = StepShape(
            nodes=req.nodes,
            ntasks=req.ntasks,
            ntasks_per_node=req.ntasks_per_node,
            gpus_per_task=req.gpus_per_task,
            gpus_per_node=req.gpus_per_node,
            gpus=req.gpus,
            overlap=req.overlap,
            nodelist=req.nodelist,
        )
        shape = with_job_gpus(with_job_tasks(shape, spec.ntasks_per_node), spec.gpus_per_task)
        if req.pty:  # a terminal: one task, on the first node (Slurm's srun --pty)
            shape = msgspec.structs.replace(shape, nodes=1, ntasks=1, ntasks_per_node=0)
        attempt, generation = int(row["attempt"]), int(row["restart_count"])
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            await repo.lock_job(conn, req.job_id)  # the GPUs read are still free at insert
            busy = await repo.held_gpus(conn, req.job_id, attempt, generation)
            lay = layout(shape, tuple(row["nodes"]), gpus, busy)
            if isinstance(lay, Refusal):
                raise Refused(f"srun: {lay.message}", "invalid")
            if isinstance(lay, Busy):  # srun says so and asks again, as Slurm's waits
                raise Refused(f"srun: {lay.message}", "busy")
            step_id = await repo.insert_step(
                conn, req, attempt, generation, lay, self.holder, self.lease_s
            )
        log.info("step", extra=kv(job=req.job_id, step=step_id, tasks=len(lay.tasks)))
        remaining = float(spec.time_limit_s) - float(row["run_s"] or 0.0)
        launches = {
            node: self._launch(req, spec, lay, node, step_id, attempt, generation)
            for node in lay.nodes
        }
        timeout = max(remaining, 0.0) + self.margin_s
        key = (req.job_id, step_id)
        stop = StepStop(
            job_id=req.job_id, attempt=attempt, generation=generation, output_dir=req.output_dir
        )
        kill = stop if req.kill_on_bad_exit else None
        self._coordinating[key] = self._spawn(self._coordinate(key, launches, timeout, kill))
        if req.answer_made:  # srun --pty's terminal goes raw, --output's files open; it asks again
            return StepReply(
                step_id=step_id,
                state=StepState.RUNNING,
                nodes=lay.nodes,
                ntasks=len(lay.tasks),
                tasks_per_node=lay.per_node(),
            )
        return await self._answer_when_ended(req.job_id, step_id)

    async def _answer_when_ended(self, job_id: int, step_id: int) -> StepReply:
        """The step's reply once its row says it ended; RUNNING after `ANSWER_S` (srun
        asks again). This replica's own step is awaited, another's row is polled."""
        deadline = time.monotonic() + ANSWER_S
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            task = self._coordinating.get((job_id, step_id))
            if task is not None:
                await asyncio.wait({task}, timeout=left)
            async with self.ctx.pool.acquire() as conn:
                row = await repo.step_row(conn, job_id, step_id)
            if row is None:
                raise Refused(f"step {job_id}.{step_id} is gone", "not_found")
            if row["state"] != StepState.RUNNING or left <= 0:
                return StepReply(
                    step_id=step_id,
                    state=row["state"],
                    nodes=tuple(row["nodes"]),
                    ntasks=row["ntasks"],
                    exit_code=row["exit_code"],
                    signal=row["signal"],
                    message=row["message"],
                )
            if task is None or task.done():
                await asyncio.sleep(min(POLL_S, left))

    async def _coordinate(
        self,
        key: tuple[int, int],
        launches: dict[str, StepLaunch],
        timeout: float,
        kill: StepStop | None = None,
    ) -> None:
        """Wait on every node's answer, renewing the step's lease, then record the end
        (only while this replica still coordinates it). `kill` (srun -K): the first
        node to answer with a bad end has the step's tasks on every node stopped."""
        job_id, step_id = key
        renewing = self._spawn(self._renew(job_id, step_id))
        nodes = tuple(launches)
        calls = [asyncio.ensure_future(self._node_call(n, b, timeout)) for n, b in launches.items()]
        try:
            if kill is not None and len(calls) > 1:
                await self._kill_on_bad_exit(kill, nodes, calls)
            outcomes = await asyncio.gather(*calls)
        finally:
            for call in calls:  # a coordinator cancelled (its replica stopping) asks no more
                call.cancel()
            renewing.cancel()
            self._coordinating.pop(key, None)
        codes: list[int | None] = []
        signals: list[int | None] = []
        stopped: list[bool | None] = []
        problems = [f"{n}: {o.message}" for n, o in zip(nodes, outcomes, strict=True) if not o.ok]
        for o in outcomes:
            codes.extend(o.exit_codes)
            signals.extend(o.signals)
            said = len(o.stopped) == len(o.exit_codes)  # an older agent says nothing
            stopped.extend(o.stopped if said else [None] * len(o.exit_codes))
        end = step_end(codes, signals, stopped, lost=bool(problems))
        if problems and not codes:  # nothing ran anywhere: the step failed to start
            end = StepEnd(state=StepState.FAILED, exit_code=1)
        state = end.state
        message = "; ".join(problems)
        async with self.ctx.pool.acquire() as conn:
            mine = await repo.end_step(
                conn, job_id, step_id, self.holder, state, end.exit_code, end.signal, message
            )
        log.info("step ended", extra=kv(job=job_id, step=step_id, state=state, recorded=mine))

    async def _kill_on_bad_exit(
        self,
        kill: StepStop,
        nodes: tuple[str, ...],
        calls: Sequence[asyncio.Future[StepOutcome]],
    ) -> None:
        """Until every node answered, or one answered with a bad end: then the step's
        tasks are stopped on every node, as srun's Ctrl-C stops them."""
        left = await first_where(calls, lambda o: bad_end(o.exit_codes, o.signals))
        if left is None:
            return
        log.info("step task ended badly: ending the others (-K)", extra=kv(job=kill.job_id))
        try:
            await self._stop_step(kill, nodes)
        except Exception as err:  # the step's end is still waited for, recorded
            log.warning("-K stop failed", extra=kv(job=kill.job_id, error=repr(err)))

    async def _stop_step(self, stop: StepStop, nodes: Any) -> None:
        """Every node of `nodes` ends the step's tasks (those writing under its output
        folder), signed by this launcher."""
        signer = self.agents.signer
        if signer is None:
            raise Refused("the launcher has no signing key", "unavailable")

        async def one(node: str) -> None:
            body = msgspec.json.encode(signer.sign(stop, node, now=time.time()))
            try:
                await self.ctx.bus.request(f"{AGENT_PREFIX}{node}.step_stop", body, timeout=5.0)
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("step stop not delivered", extra=kv(node=node, error=repr(err)))

        await asyncio.gather(*(one(n) for n in nodes))

    async def _renew(self, job_id: int, step_id: int) -> None:
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                async with self.ctx.pool.acquire() as conn:
                    if not await repo.renew(conn, job_id, step_id, self.holder, self.lease_s):
                        log.warning("step lease lost", extra=kv(job=job_id, step=step_id))
                        return
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("step lease not renewed", extra=kv(job=job_id, error=repr(err)))

    async def _sweep(self, stop: asyncio.Event) -> None:
        """Adopt the steps whose coordinator's lease ran out: ask their agents again."""
        while not stop.is_set():
            try:
                async with self.ctx.pool.acquire() as conn:
                    rows = await repo.claim_orphans(conn, self.holder, self.lease_s)
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("step sweep failed", extra=kv(error=repr(err)))
                rows = []
            for row in rows:
                self._adopt(row)
            await asyncio.sleep(self.renew_s)

    def _adopt(self, row: Any) -> None:
        key = (int(row["job_id"]), int(row["step_id"]))
        if key in self._coordinating:
            return
        adopt = StepLaunch(
            job_id=key[0],
            attempt=int(row["attempt"]),
            generation=int(row["generation"]),
            step_id=key[1],
            argv=tuple(row["argv"]),
            tasks=(),
            workdir="",
            adopt=True,
        )
        log.info("step adopted", extra=kv(job=key[0], step=key[1], by=self.holder))
        timeout = max(float(row["remaining_s"] or 0.0), 0.0) + self.margin_s
        launches = {node: adopt for node in row["nodes"]}
        kill = None
        if row["kill_on_bad_exit"]:  # -K holds for the replica that took the step over
            kill = StepStop(
                job_id=key[0],
                attempt=adopt.attempt,
                generation=adopt.generation,
                output_dir=row["output_dir"],
            )
        self._coordinating[key] = self._spawn(self._coordinate(key, launches, timeout, kill))

    async def cancel(self, req: StepCancelRequest) -> Ok:
        """srun was interrupted, or `scancel JOB.STEP`: every node of the job ends that
        step's tasks; its coordinator then records it CANCELLED (and answers srun). With
        a signal (`scancel -s USR1 JOB.STEP`) the tasks get it and go on running."""
        if (req.step_id is None) == (not req.output_dir):
            raise Refused("name the step by its id or by srun's output folder, one of them")
        try:
            sig = int(_signal.Signals[signal_name(req.signal)]) if req.signal else 0
        except ValueError as err:
            raise Refused(str(err)) from None
        async with self.ctx.pool.acquire() as conn:
            found = await repo.live_run(conn, req.job_id)
            step = None
            if req.step_id is not None:
                step = await repo.step_row(conn, req.job_id, req.step_id)
        name = f"step {req.job_id}.{req.step_id}"
        if req.step_id is not None and step is None:
            raise Refused(f"{name} does not exist", "not_found")
        if found is None or found[0]["state"] != JobState.RUNNING:  # a STARTING run has none
            return Ok(message=f"job {req.job_id} is not running: no step to end")
        row, spec = found
        if req.user != spec.user:
            raise Refused(f"job {req.job_id} belongs to {spec.user!r}", "forbidden")
        output_dir = req.output_dir
        if step is not None:
            if step["state"] != StepState.RUNNING:
                return Ok(message=f"{name} has already ended ({step['state']})")
            output_dir = step["output_dir"]
            if not output_dir:  # its tasks are known to the agents by srun's folder alone
                raise Refused(f"{name} was not started by srun: signal or end it with its job")
        stop = StepStop(
            job_id=req.job_id,
            attempt=int(row["attempt"]),
            generation=int(row["restart_count"]),
            output_dir=output_dir,
            signal=sig,
        )
        await self._stop_step(stop, row["nodes"])
        if sig:
            return Ok(message=f"sent {_signal.Signals(sig).name} to {name}")
        return Ok(message="step ending")

    def _launch(
        self, req: StepRequest, spec: JobSpec, lay: Layout, node: str, step_id: int,
        attempt: int, generation: int,
    ) -> StepLaunch:  # fmt: skip
        out = req.output_dir or posixpath.join(req.workdir or spec.workdir, ".muster-steps")
        tasks = tuple(
            StepTaskSpec(
                procid=t.procid,
                env=task_env(req.environment, lay, t, job_id=req.job_id, step_id=step_id),
                stdout=posixpath.join(out, f"{t.procid}.out"),
                stderr=posixpath.join(out, f"{t.procid}.err"),
            )
            for t in lay.on(node)
        )
        return StepLaunch(
            job_id=req.job_id,
            attempt=attempt,
            generation=generation,
            step_id=step_id,
            argv=req.argv,
            tasks=tasks,
            workdir=req.workdir or spec.workdir,
            run_as=None if spec.user == getpass.getuser() else spec.user,
            pty=req.pty,
            pty_window=req.pty_window,
            kill_on_bad_exit=req.kill_on_bad_exit,
        )

    async def _call(self, node: str, launch: StepLaunch, timeout: float) -> StepOutcome:
        """The node's answer to `launch` within `timeout`; asked again (`adopt`) each time
        the node's agent answers its status without the step (the module doc), or when
        the deadline comes while the job's time limit, raised since, leaves it time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        key = (launch.job_id, launch.attempt, launch.generation, launch.step_id)
        while True:
            left = max(deadline - loop.time(), 0.001)
            answer = asyncio.ensure_future(self._ask(node, launch, left))  # ends by `left`
            try:
                while not answer.done():
                    await asyncio.wait({answer}, timeout=PROBE_S)
                    if answer.done():
                        break
                    status = await self.agents.status(node, within_s=PROBE_S / 2)
                    if status.answered and key not in status.steps:
                        break
                if answer.done():
                    outcome = answer.result()
                    later = None if outcome.ok else await self._later(launch.job_id, deadline)
                    if later is None:
                        return outcome
                    deadline = later
            finally:
                await dropped(answer)
            launch = msgspec.structs.replace(launch, adopt=True)

    async def _later(self, job_id: int, deadline: float) -> float | None:
        """A new deadline for a node's answer when the old one has come but the job's
        limit was raised since (`muster update --time`): its time left plus the margin.
        None: no answer came in time after all (or the limit cannot be read now)."""
        loop = asyncio.get_running_loop()
        if loop.time() < deadline - 1.0:  # answered (a failure) before the deadline
            return None
        try:
            async with self.ctx.pool.acquire() as conn:
                left = await repo.time_left(conn, job_id)
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("time left not read", extra=kv(job=job_id, error=repr(err)))
            return None
        more = None if left is None else left + self.margin_s
        return None if more is None or more <= 1.0 else loop.time() + more

    async def _node_call(self, node: str, launch: StepLaunch, timeout: float) -> StepOutcome:
        """`_call`, and at once the node fault its answer shows: a task fenced or lost
        with the node ends the job's run there (`job.node_lost`), as Slurm ends a job
        NODE_FAIL, while the step's tasks on other nodes may still run (the run's end
        stops them: a step never outlives its job)."""
        outcome = await self._call(node, launch, timeout)
        if any(outcome.node_failed):
            why = f"a task of step {launch.job_id}.{launch.step_id} was fenced or lost there"
            lost = JobNodeLost(
                job_id=launch.job_id, attempt=launch.attempt, generation=launch.generation,
                node=node, step_id=launch.step_id, reason=why,
            )  # fmt: skip
            async with self.ctx.pool.acquire() as conn:
                rows = await outbox_add(conn, lost)
            self.ctx.relay.kick(rows)
            log.info("step task lost with its node", extra=kv(job=launch.job_id, node=node))
        return outcome

    async def _ask(self, node: str, launch: StepLaunch, timeout: float) -> StepOutcome:
        signer = self.agents.signer
        if signer is None:
            return StepOutcome(ok=False, message="the launcher has no signing key")
        body = signer.sign(launch, node, now=time.time())
        try:
            raw = await self.ctx.bus.request(
                f"{AGENT_PREFIX}{node}.step", msgspec.json.encode(body), timeout=timeout
            )
        except Exception as err:
            if not is_transient(err):
                raise
            return StepOutcome(ok=False, message=f"node {node} did not answer: {err!r}")
        return msgspec.json.decode(raw, type=StepOutcome)
