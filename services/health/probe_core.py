"""Pure core of the node probe: turn what NVML, the kernel log and the counters saw into
one stream of faults, and judge a health check.

The same XID usually arrives twice (an NVML event and an NVRM kernel line, in either
order) and some arrive as storms (Xid 13 once per faulting warp). `dedupe` lets the
first sighting of (GPU, XID) through at once, which is what the latency budget needs,
and drops repeats inside a window. Kernel lines name a PCI address; `pci_index` maps it
to the NVML index by integers, so "0000:3b:00" matches "00000000:3B:00.0".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum

import msgspec

from services.health.catalog import Classification, classify
from services.health.gpu import (
    XID_RECOVERY_ACTION,
    GpuCounters,
    GpuEvent,
    GpuInfo,
    PciAddress,
)
from services.health.xid import XidRecord

XID_ROW_REMAP_PENDING = 63
XID_ROW_REMAP_FAILED = 64
XID_DBE = 48
_ACTION_RE = re.compile(r"\bto 0x(?P<action>[0-9a-fA-F]{1,8})\b")


class Source(StrEnum):
    NVML = "nvml"
    KMSG = "kmsg"
    COUNTERS = "counters"


class Sighting(msgspec.Struct, frozen=True, kw_only=True):
    """One XID as one source saw it, on a GPU index (None: PCI address not ours)."""

    gpu: int | None
    xid: int
    source: Source
    at: float  # monotonic seconds when the probe saw it
    pci: PciAddress | None = None
    pid: int | None = None
    process: str | None = None
    recovery_action: int | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    message: str = ""

    @property
    def classification(self) -> Classification:
        return classify(self.xid, self.recovery_action)


def pci_index(inventory: Iterable[GpuInfo]) -> dict[PciAddress, int]:
    """PCI slot (function 0) -> GPU index. Build it from the first inventory and keep
    it: a GPU that falls off the bus leaves later inventories, but its lines still come."""
    return {info.pci.slot: info.index for info in inventory}


def from_event(event: GpuEvent, at: float) -> Sighting:
    return Sighting(
        gpu=event.index,
        xid=event.xid,
        source=Source.NVML,
        at=at,
        recovery_action=event.recovery_action,
        gpu_instance=event.gpu_instance,
        compute_instance=event.compute_instance,
    )


def from_record(record: XidRecord, by_pci: dict[PciAddress, int], at: float) -> Sighting:
    action = recovery_action_in(record.message) if record.xid == XID_RECOVERY_ACTION else None
    return Sighting(
        gpu=by_pci.get(record.pci.slot),
        xid=record.xid,
        source=Source.KMSG,
        at=at,
        pci=record.pci,
        pid=record.pid,
        process=record.process,
        recovery_action=action,
        gpu_instance=record.gpu_instance,
        compute_instance=record.compute_instance,
        message=record.message,
    )


def recovery_action_in(message: str) -> int | None:
    """The new action in an Xid 154 message: "... changed from 0x0 (None) to 0x1 (...)"."""
    match = _ACTION_RE.search(message)
    return int(match["action"], 16) if match else None


class Dedupe(msgspec.Struct, frozen=True, kw_only=True):
    """Recently passed (GPU, XID, action) keys and when; immutable."""

    window_s: float = 5.0
    seen: dict[str, float] = {}


def _key(s: Sighting) -> str:
    where = str(s.gpu) if s.gpu is not None else str(s.pci)
    action = s.recovery_action if s.xid == XID_RECOVERY_ACTION else None
    return f"{where}/{s.xid}/{action}"


def dedupe(state: Dedupe, sighting: Sighting) -> tuple[Dedupe, Sighting | None]:
    """Let the first sighting of a (GPU, XID) through; drop repeats within the window
    (measured from the last one let through, so a storm cannot extend it forever)."""
    key = _key(sighting)
    horizon = sighting.at - state.window_s
    seen = {k: t for k, t in state.seen.items() if t > horizon}
    last = seen.get(key)
    if last is not None and sighting.at - last < state.window_s:
        return Dedupe(window_s=state.window_s, seen=seen), None
    seen[key] = sighting.at
    return Dedupe(window_s=state.window_s, seen=seen), sighting


def counter_sightings(
    before: Iterable[GpuCounters], after: Iterable[GpuCounters], at: float
) -> list[Sighting]:
    """Faults the counters show that no event announced: new uncorrected ECC errors
    (as Xid 48), a newly pending row remap (63), a failed remap (64), a changed
    recovery action (154)."""
    old = {c.index: c for c in before}
    found: list[Sighting] = []
    for c in after:
        prev = old.get(c.index, GpuCounters(index=c.index))
        if c.ecc_uncorrected_volatile > prev.ecc_uncorrected_volatile:
            found.append(_counter(c.index, XID_DBE, at, None, "uncorrected ECC count rose"))
        if c.pending_remaps > 0 and prev.pending_remaps == 0:
            found.append(_counter(c.index, XID_ROW_REMAP_PENDING, at, None, "row remap pending"))
        if c.remap_failed and not prev.remap_failed:
            found.append(_counter(c.index, XID_ROW_REMAP_FAILED, at, None, "row remap failed"))
        if c.recovery_action not in (prev.recovery_action, None):
            found.append(
                _counter(c.index, XID_RECOVERY_ACTION, at, c.recovery_action, "recovery action")
            )
    return found


def _counter(gpu: int, xid: int, at: float, action: int | None, text: str) -> Sighting:
    return Sighting(
        gpu=gpu, xid=xid, source=Source.COUNTERS, at=at, recovery_action=action, message=text
    )


class CheckPolicy(msgspec.Struct, frozen=True, kw_only=True):
    max_temperature_c: int = 90
    require_nvlink: bool = True


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    passed: bool
    problems: tuple[str, ...] = ()
    unhealthy_gpus: tuple[int, ...] = ()
    reset_pending: tuple[int, ...] = ()  # healthy, but a reset would apply row remaps


def check_health(
    expected_gpus: int,
    inventory: Iterable[GpuInfo],
    counters: Iterable[GpuCounters],
    policy: CheckPolicy | None = None,
) -> CheckResult:
    """Whether the node may return to service: every expected GPU present, no
    uncorrected ECC errors since reset, no failed remap, no recovery action pending, all
    NVLink links that exist up, temperatures sane."""
    policy = policy or CheckPolicy()
    infos = {i.index: i for i in inventory}
    polled = tuple(counters)
    problems: list[str] = []
    bad: set[int] = set()
    if len(infos) < expected_gpus:
        problems.append(f"{len(infos)} of {expected_gpus} GPUs present")
    for index in sorted(set(infos) - {c.index for c in polled}):
        problems.append(f"GPU {index}: no counters")
        bad.add(index)
    for c in polled:
        for problem in _gpu_problems(c, infos.get(c.index), policy):
            problems.append(f"GPU {c.index}: {problem}")
            bad.add(c.index)
    pending = tuple(sorted(c.index for c in polled if c.pending_remaps > 0))
    return CheckResult(
        passed=not problems,
        problems=tuple(problems),
        unhealthy_gpus=tuple(sorted(bad)),
        reset_pending=pending,
    )


def _gpu_problems(c: GpuCounters, info: GpuInfo | None, policy: CheckPolicy) -> list[str]:
    problems: list[str] = []
    if info is None:
        problems.append("counters without inventory")
    elif policy.require_nvlink and not all(info.nvlink_up):
        down = [i for i, up in enumerate(info.nvlink_up) if not up]
        problems.append(f"NVLink links down: {down}")
    if c.ecc_uncorrected_volatile > 0:
        problems.append(f"{c.ecc_uncorrected_volatile} uncorrected ECC errors")
    if c.remap_failed:
        problems.append("row remapping failed")
    if c.recovery_action not in (None, 0):
        problems.append(f"recovery action {c.recovery_action} pending")
    if c.temperature_c > policy.max_temperature_c:
        problems.append(f"temperature {c.temperature_c} C")
    return problems
