"""Simulated GPUs: a fake of the GPU (never of the scheduler) behind the `GpuBackend`
contract, for tests and `muster up` on machines without GPUs.

Plumbing, not a pure core: it holds mutable state behind one `threading.Condition`,
because the shell injects faults from the event loop while another thread blocks in
`wait_events`. An injection notifies the condition, so the waiter wakes at once (the fault
path budget is 250 ms end to end; this hop costs microseconds).

Faults are scriptable: `inject_xid`, `lose_gpu`, `raise_counter`, `set_recovery_action`,
`schedule(at_s, action)` for faults at times; `reset(gpu)` and `reboot()` heal. Every XID
is also rendered as the NVRM kernel line the driver would print (`take_kernel_lines`), so
the kernel-log path is exercised by the same fault.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

import msgspec

from services.health.gpu import (
    XID_GPU_LOST,
    XID_RECOVERY_ACTION,
    GpuCounters,
    GpuEvent,
    GpuEventKind,
    GpuInfo,
    PciAddress,
)

Clock = Callable[[], float]
Action = Callable[["SimulatedGpuBackend"], None]

_UUID_NAMESPACE = uuid.UUID("6f1c3a52-5d0e-4a8e-9d1b-2f7c4e1a9b30")
_NVLINK_LINKS = 18  # H100 SXM has 18 NVLink 4 links
_GPUS_PER_DOMAIN = 16
_COUNTER_FIELDS = frozenset(GpuCounters.__struct_fields__) - {"index"}
_BASE_TEMPERATURE_C = 35
_KMSG_RING = 4096  # like the kernel ring buffer: old lines are overwritten, not hoarded

# Messages the driver prints after "pid=..., name=...," for the common XIDs.
_XID_MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f3a_8c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    45: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the "
    "framebuffer at partition 6, subpartition 0.",
    63: "Row Remapper: New row (0x000000000013d3c0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x000000000013d3c0).",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function "
    "76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
}


def sim_pci_address(index: int) -> PciAddress:
    """Deterministic, realistic-looking bus numbers (0x18, 0x28, ...), 16 per domain."""
    return PciAddress(
        domain=index // _GPUS_PER_DOMAIN,
        bus=(0x18 + 0x10 * (index % _GPUS_PER_DOMAIN)) & 0xFF,
        device=0,
        function=0,
    )


def kmsg_line_for(
    pci: PciAddress, xid: int, pid: int | None = None, name: str | None = None
) -> str:
    """The NVRM line the driver prints for this XID (r535+ form, with pid/name)."""
    pid_text = str(pid) if pid is not None else "'<unknown>'"
    name_text = name if name is not None else "<unknown>"
    slot = f"{pci.domain:04x}:{pci.bus:02x}:{pci.device:02x}"
    message = _XID_MESSAGES.get(xid, "Xid event")
    return f"NVRM: Xid (PCI:{slot}): {xid}, pid={pid_text}, name={name_text}, {message}"


class _Gpu(msgspec.Struct, kw_only=True):
    info: GpuInfo
    counters: GpuCounters
    lost: bool = False


class SimulatedGpuBackend:
    """`GpuBackend` over simulated GPUs; thread-safe; every method may be called from
    any thread. `clock` is monotonic seconds (injected, so tests can use a fake)."""

    def __init__(
        self,
        node: str,
        gpu_count: int = 8,
        model: str = "SIM-H100",
        memory_mib: int = 81559,
        locality_groups: int = 2,
        clock: Clock = time.monotonic,
    ) -> None:
        if gpu_count < 0 or locality_groups < 1:
            raise ValueError(f"gpu_count {gpu_count} / locality_groups {locality_groups}")
        self.node = node
        self._clock = clock
        self._started = clock()
        self._cond = threading.Condition()
        self._gpus = [
            _Gpu(
                info=self._make_info(i, node, model, memory_mib, gpu_count, locality_groups),
                counters=GpuCounters(index=i, temperature_c=_BASE_TEMPERATURE_C),
            )
            for i in range(gpu_count)
        ]
        self._events: list[GpuEvent] = []
        self._kernel_lines: deque[str] = deque(maxlen=_KMSG_RING)
        self._sequence = itertools.count(1)
        self._timers: list[tuple[float, int, Action]] = []
        self._timer_ids = itertools.count()
        self._closed = False
        self.boots = 0

    @staticmethod
    def _make_info(
        index: int, node: str, model: str, memory_mib: int, count: int, groups: int
    ) -> GpuInfo:
        return GpuInfo(
            index=index,
            uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}",
            pci=sim_pci_address(index),
            model=model,
            memory_mib=memory_mib,
            nvlink_up=(True,) * _NVLINK_LINKS,
            locality=index * groups // max(count, 1),
        )

    # -- GpuBackend ---------------------------------------------------------------------

    def inventory(self) -> tuple[GpuInfo, ...]:
        with self._cond:
            self._run_due_locked()
            return tuple(g.info for g in self._gpus if not g.lost)

    def counters(self) -> tuple[GpuCounters, ...]:
        with self._cond:
            self._run_due_locked()
            return tuple(g.counters for g in self._gpus if not g.lost)

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        with self._cond:
            while True:
                self._run_due_locked()
                if self._events or self._closed:
                    events, self._events = self._events, []
                    return events
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(min(remaining, self._until_next_timer_locked()))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._events.clear()
            self._cond.notify_all()

    # -- fault injection ----------------------------------------------------------------

    def inject_xid(
        self,
        gpu: int,
        xid: int,
        recovery_action: int | None = None,
        *,
        pid: int | None = None,
        name: str | None = None,
    ) -> GpuEvent:
        """The driver reports XID `xid` on `gpu`: an NVML event and a kernel line. A
        `recovery_action` also sets the GPU's field-230 counter, as the driver does."""
        with self._cond:
            g = self._gpu_locked(gpu)
            self._kernel_lines.append(kmsg_line_for(g.info.pci, xid, pid, name))
            if recovery_action is not None:
                g.counters = msgspec.structs.replace(g.counters, recovery_action=recovery_action)
            return self._emit_locked(gpu, GpuEventKind.XID, xid, recovery_action)

    def lose_gpu(self, gpu: int) -> GpuEvent:
        """`gpu` falls off the bus: it leaves inventory and counters; XID 79 is logged."""
        with self._cond:
            g = self._gpu_locked(gpu)
            g.lost = True
            self._kernel_lines.append(kmsg_line_for(g.info.pci, XID_GPU_LOST))
            return self._emit_locked(gpu, GpuEventKind.GPU_LOST, XID_GPU_LOST, None)

    def set_recovery_action(self, gpu: int, action: int) -> GpuEvent:
        """The driver changes the GPU's recovery action (XID 154 and an NVML event)."""
        with self._cond:
            g = self._gpu_locked(gpu)
            g.counters = msgspec.structs.replace(g.counters, recovery_action=action)
            self._kernel_lines.append(kmsg_line_for(g.info.pci, XID_RECOVERY_ACTION))
            return self._emit_locked(gpu, GpuEventKind.RECOVERY_ACTION, XID_RECOVERY_ACTION, action)

    def raise_counter(self, gpu: int, field: str, value: int | bool | None) -> None:
        """Set one `GpuCounters` field (e.g. "ecc_uncorrected_volatile") on `gpu`."""
        if field not in _COUNTER_FIELDS:
            raise ValueError(f"unknown counter {field!r}; one of {sorted(_COUNTER_FIELDS)}")
        with self._cond:
            g = self._gpu_locked(gpu)
            g.counters = msgspec.structs.replace(g.counters, **{field: value})

    def set_nvlink(self, gpu: int, link: int, up: bool) -> None:
        """Bring one NVLink link of `gpu` down or up (seen in `inventory`)."""
        with self._cond:
            g = self._gpu_locked(gpu)
            links = list(g.info.nvlink_up)
            links[link] = up
            g.info = msgspec.structs.replace(g.info, nvlink_up=tuple(links))

    def schedule(self, at_s: float, action: Action) -> None:
        """Run `action(self)` once `at_s` seconds after this backend was created. Due
        actions run inside `wait_events`, `counters`, `inventory` and `run_due`."""
        with self._cond:
            heapq.heappush(self._timers, (self._started + at_s, next(self._timer_ids), action))
            self._cond.notify_all()

    def run_due(self) -> None:
        """Run scheduled actions that are due now (for tests with a fake clock)."""
        with self._cond:
            self._run_due_locked()

    def reset(self, gpu: int) -> None:
        """A successful GPU reset: back on the bus, volatile counters and pending remaps
        cleared (pending rows become remapped rows), recovery action back to none."""
        with self._cond:
            g = self._gpu_locked(gpu)
            g.lost = False
            c = g.counters
            g.counters = GpuCounters(
                index=gpu,
                remapped_rows=c.remapped_rows + c.pending_remaps,
                remap_failed=c.remap_failed,
                temperature_c=_BASE_TEMPERATURE_C,
                recovery_action=None,
            )
            g.info = msgspec.structs.replace(g.info, nvlink_up=(True,) * len(g.info.nvlink_up))

    def reboot(self) -> None:
        """A node reboot: every GPU reset, queued events and kernel lines gone."""
        with self._cond:
            for i in range(len(self._gpus)):
                self.reset(i)
            self._events.clear()
            self._kernel_lines.clear()
            self.boots += 1

    def take_kernel_lines(self) -> list[str]:
        """The NVRM lines logged since the last call (the simulated /dev/kmsg)."""
        with self._cond:
            lines = list(self._kernel_lines)
            self._kernel_lines.clear()
            return lines

    def kmsg_line_for(
        self, gpu: int, xid: int, pid: int | None = None, name: str | None = None
    ) -> str:
        """The NVRM line for `xid` on `gpu`, without logging it."""
        with self._cond:
            return kmsg_line_for(self._gpu_locked(gpu).info.pci, xid, pid, name)

    # -- internals (call with the condition held) ---------------------------------------

    def _gpu_locked(self, gpu: int) -> _Gpu:
        if not 0 <= gpu < len(self._gpus):
            raise IndexError(f"{self.node} has no GPU {gpu} (0..{len(self._gpus) - 1})")
        return self._gpus[gpu]

    def _emit_locked(
        self, gpu: int, kind: GpuEventKind, xid: int, recovery_action: int | None
    ) -> GpuEvent:
        event = GpuEvent(
            index=gpu,
            kind=kind,
            xid=xid,
            recovery_action=recovery_action,
            sequence=next(self._sequence),
            at_monotonic=self._clock(),
        )
        if not self._closed:
            self._events.append(event)
            self._cond.notify_all()
        return event

    def _run_due_locked(self) -> None:
        now = self._clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, action = heapq.heappop(self._timers)
            action(self)  # the Condition is re-entrant (RLock), so actions may inject

    def _until_next_timer_locked(self) -> float:
        if not self._timers:
            return float("inf")
        return max(self._timers[0][0] - self._clock(), 0.001)
