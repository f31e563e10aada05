"""GPU backend contract: the types and the Protocol both GPU paths implement.

The node probe reads GPUs through a `GpuBackend`: `nvml_backend.NvmlGpuBackend` on real
nodes (pynvml), `sim_backend.SimulatedGpuBackend` on machines without GPUs (tests,
`muster up`). Everything here is plain data; the types are frozen msgspec Structs so the
probe can put them on the bus as they are.

Threading contract: `wait_events` blocks (the shell runs it in one dedicated thread);
`inventory`, `counters` and `close` may be called from another thread at the same time.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Protocol, runtime_checkable

import msgspec

# "0000:3b:00.0" (lspci -D), "00000000:3B:00.0" (NVML busId), "0000:3b:00" (NVRM Xid
# lines carry no function), "3b:00.0" (lspci without -D: domain 0).
_PCI_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})(?:\.(?P<function>[0-7]))?$"
)
_MAX_DEVICE = 0x1F


class PciAddress(msgspec.Struct, frozen=True, kw_only=True, order=True):
    """A PCI function address as integers, so "00000000:3B:00.0" == "0000:3b:00"."""

    domain: int = 0
    bus: int
    device: int
    function: int = 0

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse any common spelling; raises ValueError naming the bad text."""
        match = _PCI_RE.match(text.strip())
        if match is None:
            raise ValueError(f"not a PCI address: {text!r} (want e.g. '0000:3b:00.0')")
        device = int(match["device"], 16)
        if device > _MAX_DEVICE:
            raise ValueError(f"PCI device number {device:#x} > 0x1f in {text!r}")
        return cls(
            domain=int(match["domain"] or "0", 16),
            bus=int(match["bus"], 16),
            device=device,
            function=int(match["function"] or "0"),
        )

    @classmethod
    def try_parse(cls, text: str) -> PciAddress | None:
        """`parse`, but None instead of an exception (for untrusted log text)."""
        try:
            return cls.parse(text)
        except ValueError:
            return None

    @property
    def slot(self) -> PciAddress:
        """The same address with function 0: what an NVRM Xid line names."""
        return msgspec.structs.replace(self, function=0)

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a GPU is and where it sits; read once at probe start and after a reset."""

    index: int  # NVML index (what CUDA_VISIBLE_DEVICES uses with PCI_BUS_ID order)
    uuid: str  # "GPU-xxxxxxxx-..."
    pci: PciAddress
    model: str
    memory_mib: int
    nvlink_up: tuple[bool, ...] = ()  # one entry per NVLink link, True when active
    locality: int = 0  # locality group: GPUs in one group talk over NVLink / one switch


class GpuCounters(msgspec.Struct, frozen=True, kw_only=True):
    """One poll of a GPU's health counters. A lost GPU has no counters."""

    index: int
    ecc_uncorrected_volatile: int = 0  # uncorrected ECC errors since the last reset
    remapped_rows: int = 0  # rows remapped for uncorrectable errors (lifetime)
    pending_remaps: int = 0  # rows waiting for a GPU reset to be remapped (NVML: 0/1)
    remap_failed: bool = False  # row remapping failed: the GPU is an RMA candidate
    temperature_c: int = 0
    recovery_action: int | None = None  # NVML field 230; None when unsupported


class GpuEventKind(StrEnum):
    XID = "xid"
    GPU_LOST = "gpu_lost"
    RECOVERY_ACTION = "recovery_action"


XID_GPU_LOST = 79  # "GPU has fallen off the bus": what NVMLError_GpuIsLost means
XID_RECOVERY_ACTION = 154  # "GPU recovery action changed"


class GpuEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One fault the backend saw. `sequence` increases per backend, for ordering."""

    index: int
    kind: GpuEventKind
    xid: int  # 79 for GPU_LOST, 154 for RECOVERY_ACTION
    recovery_action: int | None = None  # set for RECOVERY_ACTION, when known otherwise
    gpu_instance: int | None = None  # MIG instance ids when the driver names them
    compute_instance: int | None = None
    sequence: int = 0
    at_monotonic: float = 0.0  # the backend clock when the event was seen


@runtime_checkable
class GpuBackend(Protocol):
    """The GPU as the probe sees it; NVML and the simulator both implement it."""

    def inventory(self) -> tuple[GpuInfo, ...]:
        """The GPUs present now, by index. A lost GPU is left out."""
        ...

    def counters(self) -> tuple[GpuCounters, ...]:
        """Health counters of each reachable GPU. A lost GPU is left out (and reported
        once as a GPU_LOST event by `wait_events`)."""
        ...

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Block up to `timeout_ms` for fault events; return them (possibly empty).
        Returns at once when events are already queued. After `close`, returns []."""
        ...

    def close(self) -> None:
        """Release the backend; wakes a thread blocked in `wait_events`."""
        ...


class GpuBackendError(Exception):
    """The backend cannot be used at all (no driver, NVML init failed)."""

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code
