"""Launcher shell: job steps (`srun` inside a job; docs/steps.md).

`muster.api.step` (queue group `launcher`, signed by the user like every API request)
asks to run a command on the nodes of a RUNNING job the caller owns. The launcher lays
the tasks out (`steps_core.layout`), records the step (`job_steps`, RUNNING), sends
every node its tasks as a `StepLaunch` it signs (the agents run only what it signs,
inside the job's current worker), waits for every node's answer, records how the step
ended and answers srun. Each request is its own task: a step lasts as long as its
command. A node that does not answer in the job's remaining time (plus a margin)
counts as lost and the step as CANCELLED.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import posixpath
import time
from typing import TYPE_CHECKING, Any

import msgspec

from services.launcher.gang import Agents
from services.launcher.steps_core import (
    Layout,
    Refusal,
    StepShape,
    StepState,
    layout,
    step_exit,
    step_state,
    task_env,
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
from shared.db import Conn
from shared.identity import Verifier, authenticated
from shared.identity_files import IdentitySource
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.runtime import ServiceContext
from shared.settings import LauncherSettings
from shared.transient import is_transient

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)
VERB = "step"
CANCEL_VERB = "step_cancel"
QUEUE = "launcher"
MARGIN_S = 60.0  # past the job's time limit, a node's silence means it is lost


class StepService:
    def __init__(self, ctx: ServiceContext[LauncherSettings], agents: Agents) -> None:
        self.ctx = ctx
        self.agents = agents
        settings = ctx.settings
        self.identity = IdentitySource(settings.cluster_config, settings.user_keys_dir)
        self.verifier = Verifier(self.identity.directory)
        self._tasks: set[asyncio.Task[None]] = set()

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

    async def run(self, req: StepRequest) -> StepReply:
        if not req.argv:
            raise Refused("srun: no command to run")
        async with self.ctx.pool.acquire() as conn:
            found = await _running_job(conn, req.job_id)
        if found is None:
            raise Refused(f"job {req.job_id} is not running: a step runs inside a running job")
        row, spec = found
        if req.user != spec.user:
            raise Refused(
                f"job {req.job_id} belongs to {spec.user!r}: only its owner runs steps in it",
                "forbidden",
            )
        gpus: dict[str, list[int]] = json.loads(row["gpus"])
        shape = StepShape(
            nodes=req.nodes,
            ntasks=req.ntasks,
            ntasks_per_node=req.ntasks_per_node,
            gpus_per_task=req.gpus_per_task,
        )
        if req.pty:  # a terminal: one task, on the first node (Slurm's srun --pty)
            shape = StepShape(nodes=1, ntasks=1, gpus_per_task=req.gpus_per_task)
        lay = layout(shape, tuple(row["nodes"]), gpus)
        if isinstance(lay, Refusal):
            raise Refused(f"srun: {lay.message}", "invalid")
        attempt, generation = int(row["attempt"]), int(row["restart_count"])
        async with self.ctx.pool.acquire() as conn:
            step_id = await _insert_step(conn, req, attempt, lay)
        log.info("step", extra=kv(job=req.job_id, step=step_id, tasks=len(lay.tasks)))
        remaining = float(spec.time_limit_s) - float(row["run_s"] or 0.0)
        launches = {
            node: self._launch(req, spec, lay, node, step_id, attempt, generation)
            for node in lay.nodes
        }
        timeout = max(remaining, 0.0) + MARGIN_S
        outcomes = await asyncio.gather(*(self._call(n, b, timeout) for n, b in launches.items()))
        codes: list[int | None] = []
        signals: list[int | None] = []
        problems = [
            f"{n}: {o.message}" for n, o in zip(lay.nodes, outcomes, strict=True) if not o.ok
        ]
        for o in outcomes:
            codes.extend(o.exit_codes)
            signals.extend(o.signals)
        state = step_state(codes, signals, lost=bool(problems))
        if problems and not codes:  # nothing ran anywhere: the step failed to start
            state = StepState.FAILED
        exit_code = step_exit(codes, signals) if not problems or codes else 1
        message = "; ".join(problems)
        sig = next((s for s in signals if s is not None), None)
        async with self.ctx.pool.acquire() as conn:
            await _end_step(conn, req.job_id, step_id, state, exit_code, sig, message)
        return StepReply(
            step_id=step_id,
            state=str(state),
            nodes=lay.nodes,
            ntasks=len(lay.tasks),
            exit_code=exit_code,
            signal=sig,
            message=message,
        )

    async def cancel(self, req: StepCancelRequest) -> Ok:
        """srun was interrupted: every node of the job ends that step's tasks; the
        request that started the step then answers (CANCELLED) and records it."""
        async with self.ctx.pool.acquire() as conn:
            found = await _running_job(conn, req.job_id)
        if found is None:
            return Ok(message=f"job {req.job_id} is not running: no step to end")
        row, spec = found
        if req.user != spec.user:
            raise Refused(f"job {req.job_id} belongs to {spec.user!r}", "forbidden")
        signer = self.agents.signer
        if signer is None:
            raise Refused("the launcher has no signing key", "unavailable")
        stop = StepStop(
            job_id=req.job_id,
            attempt=int(row["attempt"]),
            generation=int(row["restart_count"]),
            output_dir=req.output_dir,
        )

        async def one(node: str) -> None:
            body = msgspec.json.encode(signer.sign(stop, node, now=time.time()))
            try:
                await self.ctx.bus.request(f"{AGENT_PREFIX}{node}.step_stop", body, timeout=5.0)
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("step stop not delivered", extra=kv(node=node, error=repr(err)))

        await asyncio.gather(*(one(n) for n in row["nodes"]))
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
        )

    async def _call(self, node: str, launch: StepLaunch, timeout: float) -> StepOutcome:
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


# --- repository ------------------------------------------------------------------------


async def _running_job(conn: Conn, job_id: int) -> tuple[Any, JobSpec] | None:
    row = await conn.fetchrow(
        "SELECT r.attempt, r.restart_count, r.nodes, r.gpus::text AS gpus, j.spec::text AS spec,"
        " extract(epoch FROM now() - r.started_at) AS run_s"
        " FROM job_runs r JOIN jobs j USING (job_id) WHERE r.job_id = $1 AND r.state = 'RUNNING'",
        job_id,
    )
    if row is None:
        return None
    return row, msgspec.json.decode(row["spec"], type=JobSpec)


async def _insert_step(conn: Conn, req: StepRequest, attempt: int, lay: Layout) -> int:
    """The job's next step id (0, 1, ...): taken under the job's row lock."""
    async with conn.transaction():
        await conn.execute("SELECT 1 FROM job_runs WHERE job_id = $1 FOR UPDATE", req.job_id)
        step_id = await conn.fetchval(
            "INSERT INTO job_steps(job_id, step_id, attempt, argv, nodes, ntasks, state)"
            " SELECT $1, coalesce(max(step_id) + 1, 0), $2, $3, $4, $5, $6"
            " FROM job_steps WHERE job_id = $1 RETURNING step_id",
            req.job_id,
            attempt,
            list(req.argv),
            list(lay.nodes),
            len(lay.tasks),
            str(StepState.RUNNING),
        )
    return int(step_id)


async def _end_step(
    conn: Conn, job_id: int, step_id: int, state: StepState, exit_code: int | None,
    sig: int | None, message: str,
) -> None:  # fmt: skip
    await conn.execute(
        "UPDATE job_steps SET state = $3, exit_code = $4, signal = $5, message = $6,"
        " ended_at = now() WHERE job_id = $1 AND step_id = $2",
        job_id,
        step_id,
        str(state),
        exit_code,
        sig,
        message,
    )
