"""Node probe shell: reads the node's GPUs through a `GpuBackend` (NVML or simulated),
registers the node, sends heartbeats, and reports every XID it sees.

`wait_events` blocks, so it runs in a dedicated thread and hands events to the event
loop; the loop never blocks on the GPU. Classification happens cluster-side (monitor),
so a probe only reports what it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid

import msgspec

from services.health.gpu import GpuBackend, GpuEvent
from shared.api import AGENT_PREFIX, HEARTBEAT_PREFIX, AgentReply, InjectFault
from shared.bus import Bus
from shared.events import GpuSlot, GpuXidObserved, NodeRegistered
from shared.logs import kv

log = logging.getLogger(__name__)


class NodeProbe:
    def __init__(
        self,
        bus: Bus,
        backend: GpuBackend,
        *,
        node: str,
        address: str,
        topology: tuple[str, ...],
        heartbeat_s: float,
    ) -> None:
        self.bus = bus
        self.backend = backend
        self.node = node
        self.address = address
        self.topology = topology
        self.heartbeat_s = heartbeat_s
        self.boot_id = uuid.uuid4().hex
        self._queue: asyncio.Queue[GpuEvent] = asyncio.Queue()
        self._reader: threading.Thread | None = None
        self._stop_reader = threading.Event()

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        await self.bus.serve(f"{AGENT_PREFIX}{self.node}.inject", self.node, self._on_inject)
        await self.bus.serve(f"{AGENT_PREFIX}{self.node}.reboot", self.node, self._on_reboot)
        self._start_reader(asyncio.get_running_loop())
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._heartbeats(stop))
                group.create_task(self._report(stop))
        finally:
            self._stop_reader.set()

    async def register(self) -> None:
        gpus = tuple(
            GpuSlot(
                index=g.index,
                uuid=g.uuid,
                pci=str(g.pci),
                model=g.model,
                memory_mib=g.memory_mib,
                locality=g.locality,
            )
            for g in self.backend.inventory()
        )
        event = NodeRegistered(
            node=self.node,
            address=self.address,
            gpus=gpus,
            topology=self.topology,
            boot_id=self.boot_id,
        )
        await self.bus.publish(event)
        log.info("registered", extra=kv(node=self.node, gpus=len(gpus), boot=self.boot_id))

    def _start_reader(self, loop: asyncio.AbstractEventLoop) -> None:
        def read() -> None:
            while not self._stop_reader.is_set():
                for event in self.backend.wait_events(200):
                    loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self._reader = threading.Thread(target=read, name=f"probe-{self.node}", daemon=True)
        self._reader.start()

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        subject = HEARTBEAT_PREFIX + self.node
        while not stop.is_set():
            with contextlib.suppress(OSError):
                await self.bus.nc.publish(subject, self.boot_id.encode())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.heartbeat_s)

    async def _report(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                event = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except TimeoutError:
                continue
            observed = GpuXidObserved(
                node=self.node,
                gpu=event.index,
                xid=event.xid,
                source="nvml",
                recovery_action=event.recovery_action,
                message=str(event.kind),
            )
            log.warning("xid", extra=kv(node=self.node, gpu=event.index, xid=event.xid))
            await self.bus.publish(observed)

    async def _on_inject(self, payload: bytes, _subject: str) -> bytes:
        """Fault injection enters at the GPU, so it travels the real probe path."""
        req = msgspec.json.decode(payload, type=InjectFault)
        inject = getattr(self.backend, "inject_xid", None)
        if inject is None:
            return msgspec.json.encode(AgentReply(ok=False, message="this node has real GPUs"))
        try:
            if req.lose_gpu:
                self.backend.lose_gpu(req.gpu)  # type: ignore[attr-defined]
            else:
                inject(req.gpu, req.xid, req.recovery_action)
        except (ValueError, IndexError, KeyError) as err:
            return msgspec.json.encode(AgentReply(ok=False, message=str(err)))
        return msgspec.json.encode(AgentReply(ok=True, message=f"xid {req.xid} on gpu {req.gpu}"))

    async def _on_reboot(self, _payload: bytes, _subject: str) -> bytes:
        """Simulated reboot: GPUs reset, a new boot id, registration again."""
        reboot = getattr(self.backend, "reboot", None)
        if reboot is None:
            return msgspec.json.encode(AgentReply(ok=False, message="this node has real GPUs"))
        reboot()
        self.boot_id = uuid.uuid4().hex
        await self.register()
        return msgspec.json.encode(AgentReply(ok=True, message="rebooted"))
