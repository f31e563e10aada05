"""Health monitor shell (cluster side): feeds what node probes report to the pure node
state machine (`monitor_core.step`) and applies its decisions.

Every input is one transaction: lock the nodes it concerns, rebuild their
`NodeHealth` from the `nodes` and `gpus` tables (`repo.load_health`), step the core,
write the result back and put the events the transitions owe in the outbox:

- `gpu.xid_observed` -> classify (catalog) -> `FaultSeen` -> `node.fault`
- `node.registered` -> `Heartbeat` (the boot) + `CheckPassed` / `CheckFailed` (the
  probe's health check) -> `node.recovered` when policy lets the node back
  (and `WorkersFound`: a node still running workers is CLEANING until `node.cleaned`)
- `node.cleaned` (the launcher stopped the stale workers) -> `Cleaned`
- heartbeats (core NATS, kept in memory) + a periodic `Tick` -> SUSPECT, then
  `node.down`; a draining node with no live allocation -> `Idle` -> DRAINED
- `node.drain_requested` -> `OperatorDrain` / `OperatorResume`

One clock: every transaction reads the database's `now()` once, so heartbeat times,
state changes and the flap history agree whichever monitor wrote them. The `Tick` also
says when our own NATS connection last came up (None while it is down): the core blames
no node for silence we could not have heard, and declares none DOWN within
`down_after_s` of it (a restarted monitor counts as reconnected).

State is in the database, not here (level-triggered), so a restarted monitor resumes
where the last one stopped.

Replicas: any replica handles events (each transaction locks the nodes it concerns,
the inbox makes each event apply once); only the holder of `health_lease` judges
liveness. Its pass locks the lease row and checks its epoch (`shared.lease`), so a
deposed or paused monitor's pass writes nothing, and a monitor that takes over counts
as just reconnected: it declares no node DOWN for `down_after_s`, as it may not have
heard every heartbeat the last one did. Standbys drop the heartbeats they hear.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence

import msgspec
from nats.aio.msg import Msg

from services.health import repo
from services.health.catalog import classify
from services.health.monitor_core import step
from services.health.monitor_fabric import fabric_fault_event, fabric_observation
from services.health.monitor_model import (
    AnyObservation,
    CheckFailed,
    CheckPassed,
    Cleaned,
    ClusterHealth,
    FaultSeen,
    Guard,
    HealthPolicy,
    Heartbeat,
    Idle,
    NodeHealth,
    OperatorDrain,
    OperatorResume,
    Tick,
    Transition,
    TransitionKind,
    WorkersFound,
)
from services.health.utilization import counted_s, hours_of, tally
from shared.api import AGENT_PREFIX, HEARTBEAT_PREFIX, AgentReply, InjectFault
from shared.db import Conn, idle_at_most, inbox_first_time, outbox_add
from shared.events import (
    AnyEvent,
    Event,
    GpuXidObserved,
    NodeCleaned,
    NodeDown,
    NodeDrainRequested,
    NodeFabricFaultObserved,
    NodeFault,
    NodeHookFailed,
    NodeRecovered,
    NodeRegistered,
)
from shared.lease import Lease
from shared.logs import kv
from shared.retention import DAY_S
from shared.runtime import ServiceContext, every, until_stopped
from shared.settings import HealthSettings
from shared.states import NodeState
from shared.transient import is_transient

log = logging.getLogger(__name__)

SUBJECTS = (
    "muster.node.registered.>",
    "muster.gpu.xid_observed.>",
    "muster.node.drain_requested",
    "muster.node.cleaned",
    "muster.node.fabric_fault_observed.>",
    "muster.node.hook_failed.>",
)
CONSUMER = "health"
LEASE_RELEASE_S = 2.0  # how long a stopping monitor tries to hand its lease over
RESET_WAIT_S = 30.0  # one GPU reset request; also how long stop waits for those in flight


def policy_from(settings: HealthSettings) -> HealthPolicy:
    return HealthPolicy(
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        down_after_s=settings.down_after_s,
        max_silent_share=settings.max_silent_share,
    )


class Monitor:
    def __init__(
        self, ctx: ServiceContext[HealthSettings], policy: HealthPolicy | None = None
    ) -> None:
        self.ctx = ctx
        self.policy = policy or policy_from(ctx.settings)
        self.heard: dict[str, str] = {}  # node -> boot, heard since the last pass
        self.guard = Guard.NONE  # as the last pass found it; logged when it changes
        # When our NATS connection last came up, in database time (None: down, or not
        # seen up yet); `reconnects` notices a drop shorter than one pass.
        self.connected_since: float | None = None
        self.reconnects = 0
        self._resets: list[tuple[str, tuple[int, ...]]] = []  # drained nodes' GPUs to reset
        self._tasks: set[asyncio.Task[None]] = set()  # GPU resets in flight, awaited at stop
        holder = f"health-{ctx.settings.instance}-{uuid.uuid4().hex[:8]}"
        self.lease = Lease("health_lease", holder, ctx.settings.lease_ttl_s)
        # When this holder's last pass counted the GPUs' time (database time; None: no
        # pass yet as the holder), so each second is counted once (utilization.py).
        self._tallied_at: float | None = None
        # the cluster's hourly GPU time `muster report` reads
        ctx.pruner.keep_as_set(repo.PRUNE_CLUSTER_HOURS, ctx.settings.usage_keep_s, DAY_S)

    async def run(self, stop: asyncio.Event) -> None:
        sub = await self.ctx.bus.nc.subscribe(HEARTBEAT_PREFIX + "*", cb=self._on_heartbeat)
        try:
            await until_stopped(
                stop,
                self._consume,
                self._lease_loop,
                self._liveness,
                self.ctx.relay.run,
                self.ctx.pruner.run,
            )
            await self._release_lease()
        finally:
            await sub.unsubscribe()
            await self._finish_resets()

    async def _finish_resets(self) -> None:
        """Let the GPU resets in flight end (each has its own timeout); cancel stragglers."""
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=RESET_WAIT_S)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    async def _on_heartbeat(self, msg: Msg) -> None:
        node = msg.subject.removeprefix(HEARTBEAT_PREFIX)
        self.heard[node] = msg.data.decode(errors="replace")

    # --- events ---------------------------------------------------------------------

    async def handle(self, event: AnyEvent) -> None:
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            # Short, as the judge's pass: a replica paused (SIGSTOP) in here holds the
            # event's inbox row and the nodes it touched, and with them the judging of
            # every node (the lease holder's pass waits on those rows), until the
            # server ends its session. Nothing here waits on anything but the database.
            await idle_at_most(conn, self.lease.ttl_s)
            if not await inbox_first_time(conn, CONSUMER, event.event_id):
                return
            match event:
                case NodeRegistered():
                    await self._registered(conn, event)
                case GpuXidObserved():
                    await self._xid(conn, event)
                case NodeHookFailed():
                    by = f"{event.hook} on {event.node}"
                    drain = NodeDrainRequested(node=event.node, by=by, reason=event.reason)
                    await self._operator(conn, drain)
                case NodeDrainRequested():
                    await self._operator(conn, event)
                case NodeCleaned():
                    await self._cleaned(conn, event)
                case NodeFabricFaultObserved():
                    await self._fabric(conn, event)
                case _:
                    return
        self.ctx.relay.kick()
        self._reset_drained()

    async def _registered(self, conn: Conn, reg: NodeRegistered) -> None:
        passed = reg.check_passed is not False  # a probe without a check: as before
        await repo.upsert_inventory(conn, reg, prune=passed)
        check: AnyObservation = (
            CheckPassed(node=reg.node, boot_id=reg.boot_id, reset_pending=reg.reset_pending)
            if passed
            else CheckFailed(
                node=reg.node,
                boot_id=reg.boot_id,
                problems=reg.check_problems,
                unhealthy_gpus=reg.unhealthy_gpus,
            )
        )
        await repo.record_check(
            conn,
            reg.node,
            {"passed": passed, "problems": list(reg.check_problems), "boot_id": reg.boot_id},
        )
        # Workers first: a node that returns while still running them rests in CLEANING.
        workers = WorkersFound(node=reg.node, boot_id=reg.boot_id, workers=len(reg.running))
        boot = Heartbeat(node=reg.node, boot_id=reg.boot_id)
        await self.decide(conn, [reg.node], [workers, boot, check], await repo.db_now(conn))
        log.info(
            "node registered",
            extra=kv(node=reg.node, boot=reg.boot_id, check=passed, workers=len(reg.running)),
        )

    async def _cleaned(self, conn: Conn, done: NodeCleaned) -> None:
        gone = Cleaned(node=done.node, boot_id=done.boot_id)
        await self.decide(conn, [done.node], [gone], await repo.db_now(conn))
        log.info(
            "stale workers stopped",
            extra=kv(node=done.node, boot=done.boot_id, stopped=len(done.stopped)),
        )

    async def _xid(self, conn: Conn, obs: GpuXidObserved) -> None:
        verdict = classify(obs.xid, obs.recovery_action)
        seen = FaultSeen(node=obs.node, gpu=obs.gpu, classification=verdict)
        if not await self.decide(conn, [obs.node], [seen], await repo.db_now(conn), xid=obs):
            log.warning("xid from an unknown node", extra=kv(node=obs.node))

    async def _fabric(self, conn: Conn, obs: NodeFabricFaultObserved) -> None:
        seen = fabric_observation(obs)
        now = await repo.db_now(conn)
        if not await self.decide(conn, [obs.node], [seen], now, fabric=obs):
            log.info(
                "fabric report",
                extra=kv(node=obs.node, link=obs.link, cond=obs.condition, cleared=obs.cleared),
            )

    async def _operator(self, conn: Conn, req: NodeDrainRequested) -> None:
        op: AnyObservation = (
            OperatorResume(node=req.node, by=req.by, reason=req.reason)
            if req.resume
            else OperatorDrain(node=req.node, by=req.by, reason=req.reason)
        )
        await self.decide(conn, [req.node], [op], await repo.db_now(conn))

    # --- liveness -------------------------------------------------------------------

    async def _lease_loop(self, stop: asyncio.Event) -> None:
        await every(self.lease.ttl_s / 3, stop, self._hold_lease)

    async def _hold_lease(self) -> None:
        was = self.lease.epoch
        async with self.ctx.pool.acquire() as conn:
            taken = await self.lease.hold(conn)
        if was is not None and self.lease.epoch != was:
            log.warning("lost the health lease", extra=kv(epoch=was))
        if taken:
            self.connected_since = None  # a new judge: as if just reconnected
            log.info("judging liveness", extra=kv(holder=self.lease.holder, epoch=self.lease.epoch))

    async def _release_lease(self) -> None:
        """A clean stop hands the judging over at once instead of after the TTL."""
        try:
            async with asyncio.timeout(LEASE_RELEASE_S), self.ctx.pool.acquire() as conn:
                released = await self.lease.release(conn)
        except Exception as err:  # PostgreSQL away: the lease simply expires
            if not is_transient(err):
                raise
            log.warning("health lease not released", extra=kv(error=repr(err)))
            return
        if released:
            log.info("released the health lease")

    async def _liveness(self, stop: asyncio.Event) -> None:
        await every(min(1.0, self.policy.heartbeat_timeout_s / 4), stop, self.check_liveness)

    async def check_liveness(self) -> None:
        """Apply the heartbeats heard since the last pass (stamped with this pass's
        database time: at most one pass late, in the node's favour), finish idle drains,
        and judge silence (SUSPECT, then DOWN unless the guard holds)."""
        heard, self.heard = self.heard, {}
        if self.lease.epoch is None:
            self._tallied_at = None
            return  # a standby: the lease holder stamps the heartbeats
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            # A short pass: a paused judge's transaction must not hold the lease row
            # (and so any takeover) for longer than the lease would have lasted.
            if not await self.lease.lock(conn, idle_s=self.lease.ttl_s):
                self._tallied_at = None
                return
            now = await repo.db_now(conn)
            tick = Tick(connected_since=self._connected_since(now))
            nodes = await repo.load_health(conn)
            await self._tally(conn, nodes, now)
            obs: list[AnyObservation] = [
                Heartbeat(node=name, boot_id=boot, running=nodes[name].running)
                for name, boot in sorted(heard.items())
                if name in nodes
            ]
            obs += [
                Idle(node=n.name)
                for n in nodes.values()
                if n.state is NodeState.DRAINING and n.running == 0 and n.name not in heard
            ]
            out = await self.decide(conn, None, [*obs, tick], now, loaded=nodes)
        if out:
            self.ctx.relay.kick()
        self._reset_drained()

    async def _tally(self, conn: Conn, nodes: dict[str, NodeHealth], now: float) -> None:
        """Count the time since this holder's last pass for every GPU, in the state this
        pass found it (utilization.py), in the pass's transaction."""
        seconds = counted_s(now, self._tallied_at)
        self._tallied_at = now
        if seconds:
            held = await repo.allocated_gpus(conn)
            per_second = tally(nodes.values(), held, 1.0)
            for hour, part in hours_of(now, seconds):  # an hour's start between: shared
                counted = {str(k): v * part for k, v in per_second.items()}
                await repo.add_gpu_time(conn, hour, counted)

    def _connected_since(self, now: float) -> float | None:
        """When our NATS connection last came up, as this pass sees it: a drop between
        two passes shows as a new reconnect count."""
        nc = self.ctx.bus.nc
        reconnects = int(nc.stats.get("reconnects", 0))
        if not nc.is_connected:
            self.connected_since = None
        elif self.connected_since is None or reconnects != self.reconnects:
            self.connected_since = now
        self.reconnects = reconnects
        return self.connected_since

    def _note_guard(self, state: ClusterHealth) -> None:
        """Say once, loudly, when the guard starts holding DOWN back, and when it stops."""
        if state.guard is self.guard:
            return
        was, self.guard = self.guard, state.guard
        silent = sorted(n.name for n in state.nodes.values() if n.state is NodeState.SUSPECT)
        if state.guard is Guard.NONE:
            log.warning("down guard released", extra=kv(was=was, suspect=silent))
            return
        log.log(
            logging.WARNING if state.guard is Guard.BUS_GRACE else logging.ERROR,
            "down guard holding: no node is declared DOWN (%s)",
            state.guard,
            extra=kv(guard=state.guard, suspect=silent, nodes=len(state.nodes)),
        )

    def _reset_drained(self) -> None:
        """A node drained for a GPU reset gets it: the probe resets the GPUs, checks the
        node and registers again, which returns it to service when the check passes. A
        node whose GPUs cannot be reset remotely (real NVML here) stays DRAINED for an
        operator."""
        resets, self._resets = self._resets, []
        for node, gpus in resets:
            task = asyncio.create_task(self._reset(node, gpus))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _reset(self, node: str, gpus: tuple[int, ...]) -> None:
        for gpu in gpus:
            subject = f"{AGENT_PREFIX}{node}.reset"
            try:
                raw = await self.ctx.bus.request(
                    subject, msgspec.json.encode(InjectFault(gpu=gpu)), timeout=RESET_WAIT_S
                )
            except Exception as err:  # the node may be gone again: an operator decides
                log.warning("gpu reset not done", extra=kv(node=node, gpu=gpu, error=repr(err)))
                return
            reply = msgspec.json.decode(raw, type=AgentReply)
            log.info("gpu reset", extra=kv(node=node, gpu=gpu, ok=reply.ok, msg=reply.message))

    # --- the step -------------------------------------------------------------------

    async def decide(
        self,
        conn: Conn,
        names: Sequence[str] | None,
        observations: Sequence[AnyObservation],
        now: float,
        *,
        xid: GpuXidObserved | None = None,
        fabric: NodeFabricFaultObserved | None = None,
        loaded: dict[str, NodeHealth] | None = None,
    ) -> tuple[Transition, ...]:
        """Step the core over `observations` for the known nodes among `names`; persist
        the nodes that changed and queue the events the transitions owe."""
        before = loaded if loaded is not None else await repo.load_health(conn, names)
        if not before:
            return ()
        state = ClusterHealth(policy=self.policy, nodes=dict(before), guard=self.guard)
        out: list[Transition] = []
        for o in observations:
            if not isinstance(o, Tick) and o.node not in before:
                continue  # never invent a node the tables do not have
            state, transitions = step(state, o, now)
            out.extend(transitions)
        self._note_guard(state)
        changed = [n for name, n in state.nodes.items() if before.get(name) != n]
        await repo.save_health(conn, changed)
        self._resets += [
            (t.node, gpus)
            for t in out
            if t.kind is TransitionKind.NODE_DRAINED and (gpus := _to_reset(state.nodes[t.node]))
        ]
        await outbox_add(conn, *[await self._event(conn, t, xid, fabric) for t in out if _owes(t)])
        for t in out:
            log.log(
                logging.WARNING if t.kind is not TransitionKind.NODE_RECOVERED else logging.INFO,
                "node %s",
                t.kind,
                extra=kv(node=t.node, was=t.from_state, now=t.to_state, reason=t.reason),
            )
        return tuple(out)

    async def _event(
        self,
        conn: Conn,
        t: Transition,
        xid: GpuXidObserved | None,
        fabric: NodeFabricFaultObserved | None = None,
    ) -> Event:
        if t.fabric is not None and t.kind is TransitionKind.NODE_FAULT:
            return await fabric_fault_event(conn, t, fabric)
        match t.kind:
            case TransitionKind.NODE_DOWN:
                return NodeDown(node=t.node, reason=t.reason)
            case TransitionKind.NODE_RECOVERED:
                return NodeRecovered(node=t.node, reason=t.reason)
        c = t.classification
        if c is None:  # a failed health check
            await repo.record_fault(conn, t.node, {"class": "health_check", "reason": t.reason})
            return NodeFault(
                node=t.node,
                gpu=None,
                xid=None,
                fault_class="health_check",
                action="drain_node",
                severity="error",
                excludes_node=True,
                affects_job=False,
            )
        job_id = None if t.gpu is None else await repo.job_on_gpu(conn, t.node, t.gpu)
        fault = {
            "gpu": t.gpu,
            "xid": c.xid,
            "class": str(c.fault_class),
            "action": str(c.action),
            "at": (xid.occurred_at.isoformat() if xid else None),
            "source": (xid.source if xid else None),
            "description": c.description,
            "state": str(t.to_state),
        }
        await repo.record_fault(conn, t.node, fault)
        return NodeFault(
            node=t.node,
            gpu=t.gpu,
            xid=c.xid,
            fault_class=str(c.fault_class),
            action=str(c.job_action if not c.node_fault else c.action),
            severity=str(c.severity),
            excludes_node=c.excludes_node,
            affects_job=c.affects_job,
            job_id=job_id,
        )


def _to_reset(node: NodeHealth) -> tuple[int, ...]:
    """GPUs a drained node waits to have reset: excluded ones, and pending row remaps."""
    return tuple(g.index for g in node.gpus if not g.healthy or g.reset_pending)


def _owes(t: Transition) -> bool:
    """Which transitions the placer and launcher hear about (the rest are state only)."""
    return t.kind in (
        TransitionKind.NODE_FAULT,
        TransitionKind.NODE_DOWN,
        TransitionKind.NODE_RECOVERED,
    )
