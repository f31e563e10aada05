"""Node probe shell: reads the node's GPUs through a `GpuBackend` (NVML or simulated)
and the kernel log, registers the node with the result of a health check, sends
heartbeats, and reports every fault it sees once.

Three sources feed one queue of `probe_core.Sighting`s:

- NVML events: `wait_events` blocks, so one dedicated thread waits on it (and, for the
  simulated backend, also drains its simulated /dev/kmsg, `take_kernel_lines`);
- the kernel log (`kmsg_path`: /dev/kmsg or a file), followed by `kmsg.KernelLogFollower`
  in its own thread; NVRM Xid lines are parsed (`xid.parse_xid_line`) and their PCI
  address mapped to a GPU index by integers (`probe_core.pci_index`);
- counters, polled every `poll_s` off the loop (`probe_core.counter_sightings`).

`probe_core.dedupe` lets the first sighting of a (GPU, XID) through at once, whichever
source wins, and drops the others. The loop never blocks on the GPU: backend calls run
in threads. Classification happens cluster-side (monitor), so a probe only reports what
it saw. After a (simulated) reset or reboot the probe runs `check_health` and registers
again with the result, which is what lets the monitor put the node back.

The boot id is the kernel's (`/proc/sys/kernel/random/boot_id`): an agent restart keeps
it, a reboot changes it. A simulated reboot adds a count to it (`Boots`, persisted in
the node's state folder so that a restarted agent does not undo it). Registration lists
the job workers the node's agent still runs (`running`), and every heartbeat that made a
round trip to NATS calls `on_contact`, which is what the agent's workers fence on. After
a silence longer than `fence_s` (the agent hung, or lost the network) the probe first has
the agent's jobs stopped (`fence`: their stepds should have done it, unless they hung
too), then heartbeats, then registers again: the heartbeat that brings a DOWN node back
never comes before the end of the jobs that were restarted elsewhere meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec

from services.health.fabric import FabricWatcher
from services.health.fabric_core import FabricReport
from services.health.gpu import GpuBackend, GpuCounters, PciAddress
from services.health.kmsg import KernelLogFollower
from services.health.probe_core import (
    CheckPolicy,
    CheckResult,
    Dedupe,
    Sighting,
    check_health,
    counter_sightings,
    dedupe,
    from_event,
    from_record,
    pci_index,
)
from services.health.xid import parse_xid_line
from shared.api import AGENT_PREFIX, HEARTBEAT_PREFIX, AgentReply, InjectFault
from shared.bus import Bus
from shared.events import (
    GpuSlot,
    GpuXidObserved,
    NodeFabricFaultObserved,
    NodeRegistered,
    RunningWorker,
)
from shared.logs import kv
from shared.runtime import every
from shared.transient import Backoff, is_transient

log = logging.getLogger(__name__)

Clock = Callable[[], float]
WAIT_MS = 200  # keep short: closing an NVML backend waits for a blocked wait to return
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
CONTACT_TIMEOUT_S = 2


def kernel_boot_id() -> str:
    """This boot's id from the kernel: the same for every process until a reboot."""
    try:
        return BOOT_ID_PATH.read_text().strip()
    except OSError:
        return "no-kernel-boot-id"


class Boots:
    """The boot id a node reports: the kernel's, and after `n` simulated reboots the
    kernel's with `.n` (counted in `path` when given, so it survives the agent)."""

    def __init__(self, kernel: str, path: Path | None = None) -> None:
        self.kernel = kernel
        self.path = path
        self._count = 0
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                self._count = int(path.read_text())

    def current(self) -> str:
        return self.kernel if self._count == 0 else f"{self.kernel}.{self._count}"

    def reboot(self) -> str:
        self._count += 1
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(str(self._count))
        return self.current()


def _nothing_running() -> tuple[RunningWorker, ...]:
    return ()


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
        features: tuple[str, ...] = (),
        poll_s: float | None = None,
        kmsg_path: str = "",
        expected_gpus: int | None = None,
        dedupe_window_s: float = 5.0,
        check_policy: CheckPolicy | None = None,
        clock: Clock = time.monotonic,
        boots: Boots | None = None,
        running: Callable[[], tuple[RunningWorker, ...]] = _nothing_running,
        on_contact: Callable[[], None] | None = None,
        fence_s: float | None = None,
        fence: Callable[[], Awaitable[None]] | None = None,
        fabric: FabricWatcher | None = None,
        cpus: int = 0,
        memory_mib: int = 0,
    ) -> None:
        self.bus = bus
        self.cpus, self.memory_mib = cpus, memory_mib  # announced at registration
        self.backend = backend
        self.node = node
        self.address = address
        self.topology = topology
        self.features = features
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s if poll_s is not None else heartbeat_s
        self.kmsg_path = kmsg_path
        self.expected_gpus = expected_gpus
        self.check_policy = check_policy or CheckPolicy()
        self.clock = clock
        self.boots = boots or Boots(kernel_boot_id())
        self.boot_id = self.boots.current()
        self.running = running
        self.on_contact = on_contact
        self.fence_s = fence_s
        self.fence = fence
        self._contact_at = clock()  # the bus we were given is connected
        self._must_register = False
        self._window_s = dedupe_window_s
        self._fabric_failed_check = False
        self._dedupe = Dedupe(window_s=dedupe_window_s)
        self._by_pci: dict[PciAddress, int] = {}
        self._counters: tuple[GpuCounters, ...] = ()
        self._queue: asyncio.Queue[Sighting] = asyncio.Queue()
        self._stop_threads = threading.Event()
        self.reported: list[GpuXidObserved] = []  # the last few, for tests and debugging
        self.fabric = fabric
        if fabric is not None:
            fabric.report = self.report_fabric
            fabric.on_clean = self.fabric_clean

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        first = await asyncio.to_thread(self.backend.inventory)
        # Built once and kept: a GPU that falls off the bus still logs lines.
        self._by_pci = pci_index(first)
        if self.expected_gpus is None:
            self.expected_gpus = len(first)
        self._counters = await asyncio.to_thread(self.backend.counters)
        # Listen first, then announce: a registered node answers its agent requests.
        for verb, handler in (
            ("inject", self._on_inject),
            ("reboot", self._on_reboot),
            ("reset", self._on_reset),
        ):
            await self.bus.serve(f"{AGENT_PREFIX}{self.node}.{verb}", self.node, handler)
        self._start_reader(loop)
        follower = None
        if self.kmsg_path:
            follower = KernelLogFollower(self.kmsg_path, lambda line: self._from_line(loop, line))
            follower.start()
        try:
            await self.register()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._heartbeats(stop))
                group.create_task(self._report(stop))
                group.create_task(every(self.poll_s, stop, self.poll_counters))
                if self.fabric is not None and self.fabric.watching:
                    group.create_task(self.fabric.run(stop))
        finally:
            self._stop_threads.set()
            if follower is not None:
                follower.stop()

    # --- registration and the health check ------------------------------------------

    async def check(self) -> tuple[tuple[GpuSlot, ...], CheckResult]:
        inventory, counters = await asyncio.to_thread(
            lambda: (self.backend.inventory(), self.backend.counters())
        )
        expected = self.expected_gpus if self.expected_gpus is not None else len(inventory)
        result = check_health(expected, inventory, counters, self.check_policy)
        fabric = self.fabric.problems() if self.fabric is not None else ()
        if fabric:
            problems = (*result.problems, *fabric)
            result = msgspec.structs.replace(result, passed=False, problems=problems)
        missing = set(range(expected)) - {g.index for g in inventory}
        if missing:
            bad = tuple(sorted({*result.unhealthy_gpus, *missing}))
            result = msgspec.structs.replace(result, unhealthy_gpus=bad)
        slots = tuple(
            GpuSlot(
                index=g.index,
                uuid=g.uuid,
                pci=str(g.pci),
                model=g.model,
                memory_mib=g.memory_mib,
                locality=g.locality,
            )
            for g in inventory
        )
        return slots, result

    async def register(self) -> CheckResult:
        gpus, result = await self.check()
        event = NodeRegistered(
            node=self.node,
            address=self.address,
            gpus=gpus,
            topology=self.topology,
            features=self.features,
            boot_id=self.boot_id,
            cpus=self.cpus,
            memory_mib=self.memory_mib,
            check_passed=result.passed,
            check_problems=result.problems,
            unhealthy_gpus=result.unhealthy_gpus,
            reset_pending=result.reset_pending,
            running=self.running(),
        )
        # Through a NATS fail-over too: the agent's first registration met a stream
        # electing its leader (soak seed 415) and ended the node agent.
        await self._publish_through_outages(event)
        log.info(
            "registered",
            extra=kv(node=self.node, gpus=len(gpus), boot=self.boot_id, check=result.passed),
        )
        if not result.passed:
            log.warning("health check failed", extra=kv(node=self.node, problems=result.problems))
        # Failed for the fabric alone: the link's return is what must run the check again.
        self._fabric_failed_check = not result.passed and all(
            p.startswith("fabric ") for p in result.problems
        )
        return result

    # --- sources --------------------------------------------------------------------

    def _start_reader(self, loop: asyncio.AbstractEventLoop) -> None:
        take_lines: Callable[[], list[str]] | None = getattr(
            self.backend, "take_kernel_lines", None
        )

        def read() -> None:
            while not self._stop_threads.is_set():
                events = self.backend.wait_events(WAIT_MS)
                at = self.clock()
                for event in events:
                    loop.call_soon_threadsafe(self._queue.put_nowait, from_event(event, at))
                for line in take_lines() if take_lines is not None else ():
                    self._from_line(loop, line)

        threading.Thread(target=read, name=f"probe-{self.node}", daemon=True).start()

    def _from_line(self, loop: asyncio.AbstractEventLoop, line: str) -> None:
        """Called from a reader thread: parse one kernel line, queue its Xid if any."""
        record = parse_xid_line(line)
        if record is not None:
            sighting = from_record(record, self._by_pci, self.clock())
            loop.call_soon_threadsafe(self._queue.put_nowait, sighting)

    async def poll_counters(self) -> None:
        after = await asyncio.to_thread(self.backend.counters)
        for sighting in counter_sightings(self._counters, after, self.clock()):
            self._queue.put_nowait(sighting)
        self._counters = after

    # --- reporting ------------------------------------------------------------------

    async def _report(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                sighting = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except TimeoutError:
                continue
            await self.report(sighting)

    async def report_fabric(self, r: FabricReport, source: str) -> None:
        """A fabric fault raised or cleared (fabric_core decided it): on the bus, like
        an XID, for the monitor to classify."""
        assert self.fabric is not None
        event = NodeFabricFaultObserved(
            node=self.node,
            link=r.link,
            condition=str(r.condition),
            detail=r.detail,
            cleared=r.cleared,
            source=source,
            faulted=tuple(self.fabric.faults()),
        )
        log.warning(
            "fabric",
            extra=kv(node=self.node, link=r.link, cond=r.condition, cleared=r.cleared, src=source),
        )
        await self._publish_through_outages(event)

    async def fabric_clean(self) -> None:
        """Every link is well again: a check this node failed on its fabric alone passes
        now, so register with it (that is what returns a node the check drained)."""
        if self._fabric_failed_check:
            await self.register()

    async def _publish_through_outages(
        self, event: GpuXidObserved | NodeFabricFaultObserved | NodeRegistered
    ) -> None:
        """An XID (or a registration) while NATS fails over is published once it is back:
        a transient bus error used to end the reporter's task group, and with it the node
        agent. The event's id makes a repeat of one that did land a duplicate JetStream
        drops."""
        backoff = Backoff()
        while True:
            try:
                await self.bus.publish(event)
                return
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning(
                    "cannot publish yet", extra=kv(event=type(event).__name__, error=repr(err))
                )
                await asyncio.sleep(backoff.next_s())

    async def report(self, sighting: Sighting) -> GpuXidObserved | None:
        """Publish a sighting unless it repeats one already reported."""
        self._dedupe, passed = dedupe(self._dedupe, sighting)
        if passed is None:
            log.debug("repeat", extra=kv(gpu=sighting.gpu, xid=sighting.xid, src=sighting.source))
            return None
        if passed.gpu is None:
            log.warning("xid on a PCI device that is not one of our GPUs", extra=kv(pci=passed.pci))
            return None
        observed = GpuXidObserved(
            node=self.node,
            gpu=passed.gpu,
            xid=passed.xid,
            source=str(passed.source),
            pid=passed.pid,
            recovery_action=passed.recovery_action,
            message=passed.message,
        )
        log.warning(
            "xid", extra=kv(node=self.node, gpu=passed.gpu, xid=passed.xid, src=passed.source)
        )
        await self._publish_through_outages(observed)
        self.reported = [*self.reported[-31:], observed]
        return observed

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        subject = HEARTBEAT_PREFIX + self.node
        while not stop.is_set():
            await self.heartbeat(subject)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.heartbeat_s)

    async def heartbeat(self, subject: str) -> None:
        """One heartbeat; a round trip to the server (flush) proves contact. After a
        silence past `fence_s`: fence first, register again after."""
        silent_s = self.clock() - self._contact_at
        if self.fence_s is not None and silent_s > self.fence_s:
            log.warning("control plane lost: fencing", extra=kv(node=self.node, silent=silent_s))
            self._must_register = True
            if self.fence is not None:
                await self.fence()
        try:
            await self.bus.nc.publish(subject, self.boot_id.encode())
            await self.bus.round_trip(CONTACT_TIMEOUT_S)
        except Exception as err:
            if not is_transient(err):
                raise
            log.debug("heartbeat without contact", extra=kv(error=repr(err)))
            return
        self._contact_at = self.clock()
        if self.on_contact is not None:
            self.on_contact()
        if self._must_register:
            try:
                await self.register()
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("cannot register again yet", extra=kv(error=repr(err)))
                return
            self._must_register = False

    # --- agent requests (simulated GPUs) --------------------------------------------

    async def _on_inject(self, payload: bytes, _subject: str) -> bytes:
        """Fault injection enters at the GPU, so it travels the real probe path."""
        req = msgspec.json.decode(payload, type=InjectFault)
        inject = getattr(self.backend, "inject_xid", None)
        if inject is None:
            return _reply(False, "this node has real GPUs")
        try:
            if req.lose_gpu:
                self.backend.lose_gpu(req.gpu)  # type: ignore[attr-defined]
            else:
                inject(req.gpu, req.xid, req.recovery_action)
        except (ValueError, IndexError, KeyError) as err:
            return _reply(False, str(err))
        return _reply(True, f"xid {req.xid} on gpu {req.gpu}")

    async def _on_reboot(self, _payload: bytes, _subject: str) -> bytes:
        """Simulated reboot: GPUs reset, a new boot id, a health check, registration."""
        reboot = getattr(self.backend, "reboot", None)
        if reboot is None:
            return _reply(False, "this node has real GPUs")
        await asyncio.to_thread(reboot)
        self.boot_id = self.boots.reboot()
        return await self._recheck("rebooted")

    async def _on_reset(self, payload: bytes, _subject: str) -> bytes:
        """Simulated GPU reset (same boot), then a health check and registration."""
        req = msgspec.json.decode(payload, type=InjectFault)
        reset = getattr(self.backend, "reset", None)
        if reset is None:
            return _reply(False, "this node has real GPUs")
        try:
            await asyncio.to_thread(reset, req.gpu)
        except (ValueError, IndexError) as err:
            return _reply(False, str(err))
        return await self._recheck(f"gpu {req.gpu} reset")

    async def _recheck(self, what: str) -> bytes:
        self._dedupe = Dedupe(window_s=self._window_s)  # a healed GPU may fail again
        self._counters = await asyncio.to_thread(self.backend.counters)
        result = await self.register()
        verdict = "check passed" if result.passed else "check failed: " + "; ".join(result.problems)
        return _reply(True, f"{what}; {verdict}")


def _reply(ok: bool, message: str) -> bytes:
    return msgspec.json.encode(AgentReply(ok=ok, message=message))
