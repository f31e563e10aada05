"""Shell: the coordinator's side of the node agents. Builds each node's `WorkerSpec`
and starts, stops and signals a job's workers on its nodes over NATS request-reply.

Every call returns the agents' answers as values (an unreachable node is an answer
that says so); nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import signal as _signal
import sys

import msgspec

from services.launcher.env import build_env, place_worker
from services.launcher.torchrun import SPOOL, worker_argv
from shared.api import AGENT_PREFIX, AgentReply, FreePortRequest, StopWorkers, WorkerSpec
from shared.bus import Bus
from shared.jobspec import JobSpec
from shared.outputs import output_paths
from shared.transient import is_transient


class Generation(msgspec.Struct, frozen=True, kw_only=True):
    """One start of a job's workers: generation `generation` of allocation `attempt`
    (docs/launching.md, "Attempt, generation, restart count")."""

    job_id: int
    attempt: int
    generation: int
    nodes: tuple[str, ...]  # node-rank order
    gpus: dict[str, list[int]]


class Agents:
    def __init__(self, bus: Bus, *, request_timeout_s: float = 5.0) -> None:
        self.bus = bus
        self.timeout_s = request_timeout_s

    async def start(
        self, spec: JobSpec, gen: Generation, master: str, port: int
    ) -> dict[str, AgentReply]:
        """Start the generation on every node at once; each node's answer."""
        nodes = list(gen.nodes)
        specs = [worker_spec(spec, gen, node, master, port) for node in nodes]
        replies = await asyncio.gather(
            *(self.call(n, "start", s) for n, s in zip(nodes, specs, strict=True))
        )
        return dict(zip(nodes, replies, strict=True))

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

    async def signal(
        self, job_id: int, nodes: tuple[str, ...], sig: int, *, leader_only: bool
    ) -> None:
        """Send `sig` without waiting; `leader_only` (`--signal=B:`) names it `B:SIG...`."""
        name = _signal.Signals(sig).name
        req = StopWorkers(job_id=job_id, signal=f"B:{name}" if leader_only else name, wait=False)
        await asyncio.gather(*(self.call(n, "stop", req) for n in nodes))

    async def call(
        self, node: str, verb: str, body: msgspec.Struct, timeout: float | None = None
    ) -> AgentReply:
        try:
            raw = await self.bus.request(
                f"{AGENT_PREFIX}{node}.{verb}",
                msgspec.json.encode(body),
                timeout=timeout or self.timeout_s,
            )
        except Exception as err:
            if not is_transient(err):  # no responders, a timeout, NATS away: an answer
                raise
            return AgentReply(ok=False, message=f"node {node} did not answer: {err!r}")
        return msgspec.json.decode(raw, type=AgentReply)


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
    return WorkerSpec(
        job_id=gen.job_id,
        attempt=gen.attempt,
        generation=gen.generation,
        argv=tuple(worker_argv(runnable, placement, sys.executable)),
        env=build_env(spec, placement, dict(os.environ)),
        workdir=spec.workdir,
        stdout=out,
        stderr=err,
        run_as=None if spec.user == getpass.getuser() else spec.user,
        script=spec.script,
        script_name=spec.script_name,
    )
