"""Shell: the coordinator's side of the node agents. Builds each node's `WorkerSpec`
and starts, stops and signals a job's workers on its nodes over NATS request-reply.

Every call returns the agents' answers as values (an unreachable node is an answer
that says so); nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import signal as _signal
import sys
import time
from typing import Any

import msgspec

from services.launcher.coordinator_model import SignalWorkers
from services.launcher.env import job_env, place_worker
from services.launcher.status_probe import StatusProbe
from services.launcher.torchrun import SPOOL, worker_argv
from shared.agent_auth import GrantSigner, launcher_key_paths, load_grant_signer
from shared.api import (
    AGENT_PREFIX,
    AgentReply,
    FreePortRequest,
    StatusRequest,
    StopWorkers,
    WorkerLimits,
    WorkerSpec,
)
from shared.bus import Bus
from shared.identity_files import KeyFileError
from shared.jobspec import JobSpec
from shared.logs import kv
from shared.outputs import output_paths
from shared.transient import is_transient

log = logging.getLogger(__name__)
# A `--batch-nodes=first` job's worker on every node but the first: it holds the node
# for the job's steps (a step runs on a node only while the job's worker runs there)
# until the job ends and the launcher stops it; the batch script runs on the first node.
HOLDER_ARGV = ("/bin/sh", "-c", "exec sleep 2147483647")
# One node's start is never waited for longer, whatever its status says: beyond a
# start's own time (stepd_client.START_TIMEOUT_S) and any site prolog's timeout.
START_CAP_S = 900.0


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """One start of a job's workers: generation `generation` of allocation `attempt`
    (docs/launching.md, "Attempt, generation, restart count")."""

    job_id: int
    attempt: int
    generation: int
    nodes: tuple[str, ...]  # node-rank order
    gpus: dict[str, list[int]]


class Agents:
    """`signer` (the launcher's key) signs every start and stop for the node it is sent
    to (shared/agent_auth.py); without one nothing is sent and each node's answer says so."""

    def __init__(
        self, bus: Bus, *, signer: GrantSigner | None, request_timeout_s: float = 5.0
    ) -> None:
        self.bus = bus
        self.signer = signer
        self.timeout_s = request_timeout_s
        self._status = StatusProbe(self._ask_status)

    async def status(self, node: str, within_s: float) -> AgentReply:
        """`node`'s status from a request sent at most `within_s` ago, shared with the
        other waits on that node (status_probe.py)."""
        return await self._status.status(node, time.monotonic() - within_s)

    async def _ask_status(self, node: str) -> AgentReply:
        return await self.call(node, "status", StatusRequest())

    async def start(
        self, spec: JobSpec, gen: Generation, master: str, port: int
    ) -> dict[str, AgentReply]:
        """Start the generation on every node at once; each node's answer."""
        nodes = list(gen.nodes)
        specs = [worker_spec(spec, gen, node, master, port) for node in nodes]
        replies = await asyncio.gather(
            *(self._start_on(n, s) for n, s in zip(nodes, specs, strict=True))
        )
        return dict(zip(nodes, replies, strict=True))

    async def _start_on(self, node: str, body: WorkerSpec) -> AgentReply:
        """`start` on `node`, its answer waited for as long as the agent's `status`
        lists the start (a site prolog may take a minute, behind it the starts queued
        after it; the agent bounds each start itself). An agent that answers neither in
        `timeout_s`, or no longer knows the start (restarted), did not answer."""
        key = (body.job_id, body.attempt, body.generation)
        loop = asyncio.get_running_loop()
        cap = loop.time() + START_CAP_S
        asked = asyncio.ensure_future(self.call(node, "start", body, timeout=START_CAP_S))
        try:
            while loop.time() < cap:
                await asyncio.wait({asked}, timeout=self.timeout_s)
                if asked.done():
                    return asked.result()
                status = await self.call(node, "status", StatusRequest())
                if asked.done():
                    return asked.result()
                if status.answered and key in status.starting:
                    continue
                if status.answered and key in status.workers:
                    # it runs, and this ask is unanswered (an agent restarted under the
                    # start adopted it): asked again, a running start answers at once
                    await dropped(asked)
                    asked = asyncio.ensure_future(
                        self.call(node, "start", body, timeout=START_CAP_S)
                    )
                    continue
                why = "does not list it" if status.answered else "did not answer either"
                return AgentReply(
                    ok=False, answered=False,
                    message=f"node {node} did not answer its start in {self.timeout_s:.0f} s"
                    f" and its status {why}",
                )  # fmt: skip
            return AgentReply(
                ok=False, answered=False,
                message=f"node {node} did not answer its start in {START_CAP_S:.0f} s",
            )  # fmt: skip
        finally:
            await dropped(asked)

    async def free_port(self, node: str) -> AgentReply:
        """A port free on `node` itself (the rendezvous host): only it can know."""
        reply = await self.call(node, "port", FreePortRequest())
        if reply.ok and reply.port <= 0:
            return AgentReply(ok=False, message=f"node {node} named no free port")
        return reply

    async def stop(
        self, job_id: int, nodes: tuple[str, ...], grace_s: float,
        key: tuple[int, int | None] | None = None,
    ) -> dict[str, AgentReply]:  # fmt: skip
        """SIGTERM, SIGKILL after `grace_s`; each node's answer, once every node answered
        or ran out of time (the grace plus a margin, so a lost node cannot hang us).
        `key` (attempt, generation): stop only that worker, never a newer one."""
        attempt, generation = key if key is not None else (None, None)
        req = StopWorkers(job_id=job_id, grace_s=grace_s, attempt=attempt, generation=generation)
        timeout = grace_s + 10.0
        replies = await asyncio.gather(*(self.call(n, "stop", req, timeout=timeout) for n in nodes))
        return dict(zip(nodes, replies, strict=True))

    async def signal(self, job_id: int, act: SignalWorkers) -> None:
        """Send `act`'s signal to its nodes without waiting; `leader_only`
        (`--signal=B:`) names it `B:SIG...`; its scope: the worker, or the tasks of the
        job's steps there."""
        name = _signal.Signals(act.signal).name
        signal = f"B:{name}" if act.leader_only else name
        req = StopWorkers(job_id=job_id, signal=signal, wait=False, scope=act.scope)
        await asyncio.gather(*(self.call(n, "stop", req) for n in act.nodes))

    async def call(
        self, node: str, verb: str, body: msgspec.Struct, timeout: float | None = None
    ) -> AgentReply:
        if verb in ("start", "stop") and isinstance(body, WorkerSpec | StopWorkers):
            if self.signer is None:
                return AgentReply(
                    ok=False,
                    message="the launcher has no signing key (<state_dir>/launcher/launcher.nk):"
                    " agents run and stop only what it signs",
                )
            body = self.signer.sign(body, node, now=time.time())
        try:
            raw = await self.bus.request(
                f"{AGENT_PREFIX}{node}.{verb}",
                msgspec.json.encode(body),
                timeout=timeout or self.timeout_s,
            )
        except Exception as err:
            if not is_transient(err):  # no responders, a timeout, NATS away: an answer
                raise
            return AgentReply(
                ok=False, message=f"node {node} did not answer: {err!r}", answered=False
            )
        return msgspec.json.decode(raw, type=AgentReply)


async def dropped(task: asyncio.Future[Any]) -> None:
    """A request no longer waited for: cancelled, if it has not ended, and let go
    (a start's here, a step's in steps.py)."""
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def launcher_signer(state_dir: str, path: str = "") -> GrantSigner | None:
    """The launcher's key (`path`, by default `<state_dir>/launcher/launcher.nk`); None,
    logged, if it cannot be read: then every start is refused here, with that reason."""
    seed_file = path or str(launcher_key_paths(state_dir)[0])
    try:
        return load_grant_signer(seed_file)
    except KeyFileError as err:
        log.error("no launcher key: no job can start", extra=kv(error=str(err)))
        return None


def worker_spec(spec: JobSpec, gen: Generation, node: str, master: str, port: int) -> WorkerSpec:
    """What `node`'s agent starts for this generation."""
    placement = place_worker(
        spec,
        job_id=gen.job_id,
        attempt=gen.attempt,
        generation=gen.generation,
        node=node,
        nodelist=list(gen.nodes),
        gpus=gen.gpus.get(node, []),
        master_port=port,
    )
    placement = msgspec.structs.replace(
        placement,
        master_addr=master,
        rdzv_endpoint=f"{master}:{port}",
    )
    runnable = msgspec.structs.replace(spec, script=f"{SPOOL}/{spec.script_name}")
    out, err = output_paths(spec, gen.job_id, node)
    argv = tuple(worker_argv(runnable, placement, sys.executable))
    if spec.batch_first_node and node != gen.nodes[0]:
        argv, out, err = HOLDER_ARGV, "/dev/null", "/dev/null"
    return WorkerSpec(
        job_id=gen.job_id,
        attempt=gen.attempt,
        generation=gen.generation,
        argv=argv,
        env=job_env(spec, placement),
        workdir=spec.workdir,
        stdout=out,
        stderr=err,
        run_as=None if spec.user == getpass.getuser() else spec.user,
        script=spec.script,
        script_name=spec.script_name,
        limits=worker_limits(spec, gen.gpus.get(node, [])),
    )


def worker_limits(spec: JobSpec, gpus: list[int]) -> WorkerLimits:
    """What the node's cgroup holds this worker to (docs/isolation.md)."""
    return WorkerLimits(
        memory_mib=spec.mem_mib or None,
        cpus=float(spec.cpus_per_task * spec.ntasks_per_node),
        gpus=tuple(sorted(gpus)),
        io_weight=spec.io_weight,
        io_read_bps=spec.io_read_bps,
        io_write_bps=spec.io_write_bps,
    )
