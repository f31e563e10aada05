"""Health monitor shell (cluster side): turns what node probes report into node state
and the events the placer and launcher act on.

- `gpu.xid_observed` -> classify (catalog) -> GPU/node state + `node.fault`
- `node.registered` -> a (re)booted node passes its check -> UP + `node.recovered`,
  unless it failed too often recently (flap damping: an operator must resume it)
- heartbeats (core NATS) -> a node silent past the timeout is DOWN + `node.down`
- `node.drain_requested` -> DRAINING / UP on resume
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from nats.aio.msg import Msg

from services.health import repo
from services.health.catalog import classify
from shared.api import HEARTBEAT_PREFIX
from shared.db import Conn, inbox_first_time, outbox_add
from shared.events import (
    AnyEvent,
    GpuXidObserved,
    NodeDown,
    NodeDrainRequested,
    NodeFault,
    NodeRecovered,
    NodeRegistered,
)
from shared.logs import kv
from shared.runtime import ServiceContext, every, until_stopped

log = logging.getLogger(__name__)

SUBJECTS = ("muster.node.registered", "muster.gpu.xid_observed", "muster.node.drain_requested")
OUT_OF_SERVICE = ("DOWN", "FAILED")
FLAP_LIMIT = 3  # faults within FLAP_WINDOW_S keep a node out until an operator resumes it
FLAP_WINDOW_S = 3600.0


class Monitor:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.timeout_s = ctx.settings.heartbeat_timeout_s
        self.last_seen: dict[str, float] = {}
        self.started = time.monotonic()
        self.faults: dict[str, list[float]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.nc.subscribe(HEARTBEAT_PREFIX + "*", cb=self._on_heartbeat)
        await until_stopped(stop, self._consume, self._liveness, self.ctx.relay.run)

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume("health", SUBJECTS, self.handle, stop)

    async def _on_heartbeat(self, msg: Msg) -> None:
        self.last_seen[msg.subject.removeprefix(HEARTBEAT_PREFIX)] = time.monotonic()

    async def handle(self, event: AnyEvent) -> None:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, "health", event.event_id):
                return
            match event:
                case NodeRegistered():
                    await self._registered(conn, event)
                case GpuXidObserved():
                    await self._xid(conn, event)
                case NodeDrainRequested():
                    await self._drain(conn, event)
                case _:
                    return
        self.ctx.relay.kick()

    async def _registered(self, conn: Conn, reg: NodeRegistered) -> None:
        self.last_seen[reg.node] = time.monotonic()
        row = await repo.node_row(conn, reg.node)
        state, reason, events = "UP", "", []
        if row is not None:
            state, reason = row["state"], row["reason"]
            if state in OUT_OF_SERVICE and row["boot_id"] != reg.boot_id:
                if self._flapping(reg.node):
                    reason = f"{reason}; flapping: stays out until an operator resumes it"
                else:
                    state, reason = "UP", "passed health check after reboot"
                    events.append(NodeRecovered(node=reg.node, reason=reason))
            elif state == "DOWN" and row["boot_id"] == reg.boot_id:
                state, reason = "UP", "heartbeats resumed"
                events.append(NodeRecovered(node=reg.node, reason=reason))
        await repo.upsert_registration(conn, reg, state, reason)
        await outbox_add(conn, *events)
        log.info("node registered", extra=kv(node=reg.node, state=state))

    async def _xid(self, conn: Conn, obs: GpuXidObserved) -> None:
        verdict = classify(obs.xid, obs.recovery_action)
        row = await repo.node_row(conn, obs.node)
        if row is None:
            log.warning("xid from an unknown node", extra=kv(node=obs.node))
            return
        job_id = await repo.job_on_gpu(conn, obs.node, obs.gpu)
        fault = {
            "gpu": obs.gpu,
            "xid": obs.xid,
            "class": str(verdict.fault_class),
            "action": str(verdict.action),
            "at": obs.occurred_at.isoformat(),
            "description": verdict.description,
        }
        await repo.record_fault(conn, obs.node, obs.gpu, obs.xid, fault, not verdict.excludes_gpu)
        if verdict.excludes_node and row["state"] not in OUT_OF_SERVICE:
            self.faults.setdefault(obs.node, []).append(time.monotonic())
            reason = f"xid {obs.xid} on gpu {obs.gpu}: {verdict.description}"
            await repo.set_state(conn, obs.node, "FAILED", reason)
        elif verdict.excludes_gpu and row["state"] == "UP":
            reason = f"gpu {obs.gpu} needs a reset (xid {obs.xid})"
            await repo.set_state(conn, obs.node, "DRAINING", reason)
        await outbox_add(
            conn,
            NodeFault(
                node=obs.node,
                gpu=obs.gpu,
                xid=obs.xid,
                fault_class=str(verdict.fault_class),
                action=str(verdict.job_action if not verdict.node_fault else verdict.action),
                severity=str(verdict.severity),
                excludes_node=verdict.excludes_node,
                affects_job=verdict.affects_job,
                job_id=job_id,
            ),
        )
        log.warning("fault", extra=kv(node=obs.node, gpu=obs.gpu, xid=obs.xid, job=job_id))

    def _flapping(self, node: str) -> bool:
        now = time.monotonic()
        recent = [t for t in self.faults.get(node, []) if now - t < FLAP_WINDOW_S]
        self.faults[node] = recent
        return len(recent) >= FLAP_LIMIT

    async def _drain(self, conn: Conn, req: NodeDrainRequested) -> None:
        row = await repo.node_row(conn, req.node)
        if row is None:
            return
        if req.resume:
            self.faults.pop(req.node, None)
            await repo.set_state(conn, req.node, "UP", f"resumed by {req.by}: {req.reason}")
            if row["state"] != "UP":
                await outbox_add(conn, NodeRecovered(node=req.node, reason=req.reason))
            return
        busy = await repo.node_busy(conn, req.node)
        state = "DRAINING" if busy else "DRAINED"
        await repo.set_state(conn, req.node, state, f"drained by {req.by}: {req.reason}")

    async def _liveness(self, stop: asyncio.Event) -> None:
        await every(min(1.0, self.timeout_s / 4), stop, self.check_liveness)

    async def check_liveness(self) -> None:
        """Mark silent nodes DOWN; finish drains; persist heartbeats."""
        now = time.monotonic()
        grace = now - self.started < self.timeout_s  # a restarted monitor hears first
        events: list[NodeDown] = []
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            wall = datetime.now(UTC)
            seen = [(n, wall) for n, t in self.last_seen.items() if now - t < self.timeout_s]
            await repo.touch_heartbeats(conn, seen)
            for row in await repo.live_nodes(conn):
                name = row["name"]
                last = self.last_seen.get(name)
                silent = (last is None and not grace) or (
                    last is not None and now - last > self.timeout_s
                )
                if silent:
                    reason = f"no heartbeat for more than {self.timeout_s:.0f}s"
                    await repo.set_state(conn, name, "DOWN", reason)
                    events.append(NodeDown(node=name, reason=reason))
                elif row["state"] == "DRAINING" and not await repo.node_busy(conn, name):
                    await repo.set_state(conn, name, "DRAINED", "drained: no jobs left")
            await outbox_add(conn, *events)
        if events:
            self.ctx.relay.kick()
            log.warning("nodes down", extra=kv(nodes=[e.node for e in events]))
