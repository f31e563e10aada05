"""The real GPU path: `GpuBackend` over NVML (pynvml, from nvidia-ml-py).

Plumbing with a pure middle. The pynvml calls live in small `_nvml_*` functions; what
they return is turned into our types by pure functions (`locality_groups`,
`error_event`, `decode_event`) that tests feed with plain data, since CI has no GPU.

Locality rule. NVML reports, for each pair of GPUs, the closest common ancestor in the
PCIe/NVLink tree (nvmlDeviceGetTopologyCommonAncestor): INTERNAL (0, same board),
SINGLE (10, one PCIe switch), MULTIPLE (20, several switches), HOSTBRIDGE (30), NODE
(40, same CPU socket) and SYSTEM (50, across sockets). Two GPUs share a locality group
when their level is SINGLE or closer, or when an NVLink connects them; groups are the
connected components of that relation, numbered by their lowest GPU index. On an HGX
board every GPU reaches every other over NVSwitch, so the whole board is one group;
on PCIe servers GPUs under one switch form a group.

Events: one event set registered for critical XIDs, and, when this pynvml and driver
know them, GPU-unavailable and recovery-action events; `wait_events` blocks in
nvmlEventSetWait_v2 with the caller's timeout. NVMLError_GpuIsLost anywhere means the
GPU fell off the bus: it is reported once as a GPU_LOST event with Xid 79.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from services.health.gpu import (
    XID_GPU_LOST,
    XID_RECOVERY_ACTION,
    GpuBackendError,
    GpuCounters,
    GpuEvent,
    GpuEventKind,
    GpuInfo,
    PciAddress,
)

try:  # importable without a driver; only NvmlGpuBackend() needs libnvidia-ml
    import pynvml
except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
    pynvml = None

TOPOLOGY_INTERNAL = 0
TOPOLOGY_SINGLE = 10
NEAR_LEVEL = TOPOLOGY_SINGLE  # this close or closer: same locality group
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
FIELD_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION

# Event type bits (nvmlEventType*), by name so an older pynvml simply lacks some.
_EVENT_NAMES = (
    "nvmlEventTypeXidCriticalError",
    "nvmlEventTypeGpuUnavailableError",
    "nvmlEventTypeGpuRecoveryAction",
)
EVENT_XID = 0x0008
EVENT_GPU_UNAVAILABLE = 0x4000
EVENT_RECOVERY_ACTION = 0x8000


# -- pure parts --------------------------------------------------------------------------


def locality_groups(levels: Sequence[Sequence[int]], nvlinked: set[tuple[int, int]]) -> list[int]:
    """Group id per GPU from the pairwise common-ancestor matrix (see the module doc).
    `levels[i][j]` is the NVML topology level; `nvlinked` holds (i, j) pairs joined by
    an NVLink. Ids are the lowest index in each group, so they are stable."""
    n = len(levels)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in itertools.combinations(range(n), 2):
        near = levels[i][j] <= NEAR_LEVEL or (i, j) in nvlinked or (j, i) in nvlinked
        if near:
            a, b = root(i), root(j)
            parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(n)]


def dense_groups(groups: Sequence[int]) -> list[int]:
    """Renumber group ids 0, 1, 2... in order of first appearance."""
    order: dict[int, int] = {}
    return [order.setdefault(g, len(order)) for g in groups]


def is_gpu_lost(error: BaseException) -> bool:
    """Whether an NVML error means the GPU fell off the bus (counts as Xid 79)."""
    return getattr(error, "value", None) == NVML_ERROR_GPU_IS_LOST


def is_timeout(error: BaseException) -> bool:
    return getattr(error, "value", None) == NVML_ERROR_TIMEOUT


def decode_event(
    index: int,
    event_type: int,
    event_data: int,
    gpu_instance: int | None,
    compute_instance: int | None,
    sequence: int,
    at: float,
) -> GpuEvent | None:
    """An NVML event record as a `GpuEvent`; None for types we did not ask for.
    XID events carry the XID in eventData; recovery-action events the new action."""
    if event_type & EVENT_XID:
        kind, xid, action = GpuEventKind.XID, event_data, None
    elif event_type & EVENT_GPU_UNAVAILABLE:
        kind, xid, action = GpuEventKind.GPU_LOST, XID_GPU_LOST, None
    elif event_type & EVENT_RECOVERY_ACTION:
        kind, xid, action = GpuEventKind.RECOVERY_ACTION, XID_RECOVERY_ACTION, event_data
    else:
        return None
    return GpuEvent(
        index=index,
        kind=kind,
        xid=int(xid),
        recovery_action=action,
        gpu_instance=gpu_instance,
        compute_instance=compute_instance,
        sequence=sequence,
        at_monotonic=at,
    )


def mig_id(raw: int) -> int | None:
    """NVML reports 0xFFFFFFFF for "not a MIG instance"."""
    return None if raw >= 0xFFFFFFFF else raw


def lost_event(index: int, sequence: int, at: float) -> GpuEvent:
    return GpuEvent(
        index=index,
        kind=GpuEventKind.GPU_LOST,
        xid=XID_GPU_LOST,
        sequence=sequence,
        at_monotonic=at,
    )


def text(value: bytes | str) -> str:
    """pynvml returns str or bytes depending on version."""
    return value.decode() if isinstance(value, bytes) else value


# -- thin pynvml calls -------------------------------------------------------------------


def _nvml() -> Any:
    if pynvml is None:
        raise GpuBackendError("pynvml is not installed (pip install nvidia-ml-py)")
    return pynvml


def _nvml_event_mask(nv: Any) -> int:
    return sum(getattr(nv, name) for name in _EVENT_NAMES if hasattr(nv, name))


def _nvml_pci(nv: Any, handle: Any) -> PciAddress:
    info = nv.nvmlDeviceGetPciInfo(handle)
    return PciAddress(domain=info.domain, bus=info.bus, device=info.device, function=0)


def _nvml_links(nv: Any, handle: Any) -> tuple[bool, ...]:
    links: list[bool] = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            links.append(bool(nv.nvmlDeviceGetNvLinkState(handle, link)))
        except nv.NVMLError:  # no such link on this GPU: the list ends here
            break
    return tuple(links)


def _nvml_level(nv: Any, a: Any, b: Any) -> int:
    try:
        return int(nv.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except nv.NVMLError:
        return 50  # unknown: treat as across the system


def _nvml_nvlinked(nv: Any, a: Any, b: Any) -> bool:
    try:  # NVML_P2P_CAPS_INDEX_NVLINK = 2; NVML_P2P_STATUS_OK = 0
        return int(nv.nvmlDeviceGetP2PStatus(a, b, 2)) == 0
    except nv.NVMLError:
        return False


def _nvml_temperature(nv: Any, handle: Any) -> int:
    try:
        return int(nv.nvmlDeviceGetTemperature(handle, 0))  # NVML_TEMPERATURE_GPU
    except nv.NVMLError as err:
        if is_gpu_lost(err):
            raise
        return 0


def _nvml_recovery_action(nv: Any, handle: Any) -> int | None:
    try:
        value = nv.nvmlDeviceGetFieldValues(handle, [FIELD_RECOVERY_ACTION])[0]
    except nv.NVMLError:
        return None
    if value.nvmlReturn != 0:
        return None
    return int(value.value.uiVal)


def _nvml_counters(nv: Any, index: int, handle: Any) -> GpuCounters:
    ecc = 0
    remapped, pending, failed = 0, 0, False
    try:
        ecc = int(nv.nvmlDeviceGetTotalEccErrors(handle, 1, 0))  # UNCORRECTED, VOLATILE
    except nv.NVMLError as err:
        if is_gpu_lost(err):
            raise
    try:
        _corr, unc, is_pending, is_failure = nv.nvmlDeviceGetRemappedRows(handle)
        remapped, pending, failed = int(unc), int(is_pending), bool(is_failure)
    except nv.NVMLError as err:
        if is_gpu_lost(err):
            raise
    temperature = _nvml_temperature(nv, handle)
    return GpuCounters(
        index=index,
        ecc_uncorrected_volatile=ecc,
        remapped_rows=remapped,
        pending_remaps=pending,
        remap_failed=failed,
        temperature_c=temperature,
        recovery_action=_nvml_recovery_action(nv, handle),
    )


class NvmlGpuBackend:
    """`GpuBackend` over NVML. Construct on the node; `close()` shuts NVML down.
    `nvml` is the pynvml module (the default) or a fake of it for tests."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, nvml: Any = None) -> None:
        nv = self._nv = nvml if nvml is not None else _nvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as err:
            code = getattr(err, "value", None)
            raise GpuBackendError(f"NVML init failed: {err}", code=code) from err
        self._clock = clock
        self._lock = threading.Lock()
        self._wait_lock = threading.Lock()  # held while blocked in NVML; close waits for it
        self._sequence = itertools.count(1)
        self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        self._lost: set[int] = set()
        self._pending: list[GpuEvent] = []  # lost GPUs found by polls, for wait_events
        self._closed = False
        self._events = nv.nvmlEventSetCreate()
        mask = _nvml_event_mask(nv)
        for i, handle in enumerate(self._handles):
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(handle)
                nv.nvmlDeviceRegisterEvents(handle, mask & supported, self._events)
            except nv.NVMLError as err:
                self._note_error(i, err)

    def inventory(self) -> tuple[GpuInfo, ...]:
        nv = self._nv
        infos: list[GpuInfo] = []
        for i in self._live():
            h = self._handles[i]
            try:
                info = GpuInfo(
                    index=i,
                    uuid=text(nv.nvmlDeviceGetUUID(h)),
                    pci=_nvml_pci(nv, h),
                    model=text(nv.nvmlDeviceGetName(h)),
                    memory_mib=int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024),
                    nvlink_up=_nvml_links(nv, h),
                )
            except nv.NVMLError as err:
                self._note_error(i, err)
                continue
            infos.append(info)
        return self._with_locality(infos)

    def _with_locality(self, infos: list[GpuInfo]) -> tuple[GpuInfo, ...]:
        nv = self._nv
        hs = [self._handles[g.index] for g in infos]
        levels = [[_nvml_level(nv, a, b) if a is not b else 0 for b in hs] for a in hs]
        pairs = itertools.combinations(range(len(hs)), 2)
        nvlinked = {(i, j) for i, j in pairs if _nvml_nvlinked(nv, hs[i], hs[j])}
        groups = dense_groups(locality_groups(levels, nvlinked))
        return tuple(
            msgspec.structs.replace(g, locality=grp) for g, grp in zip(infos, groups, strict=True)
        )

    def counters(self) -> tuple[GpuCounters, ...]:
        nv = self._nv
        polled: list[GpuCounters] = []
        for i in self._live():
            try:
                polled.append(_nvml_counters(nv, i, self._handles[i]))
            except nv.NVMLError as err:
                self._note_error(i, err)
        return tuple(polled)

    def wait_events(self, timeout_ms: int) -> list[GpuEvent]:
        """Blocks in nvmlEventSetWait_v2. A GPU found lost by a poll in another thread is
        reported on the next call, so keep `timeout_ms` short (the probe uses 200)."""
        nv = self._nv
        with self._lock:
            if self._closed:
                return []
            if self._pending:
                events, self._pending = self._pending, []
                return events
        try:
            with self._wait_lock:
                if self._closed:
                    return []
                data = nv.nvmlEventSetWait_v2(self._events, max(timeout_ms, 0))
        except nv.NVMLError as err:
            if is_timeout(err):
                return []
            if not is_gpu_lost(err):
                raise
            self.counters()  # the set cannot say which GPU is lost: a poll finds it
            with self._lock:
                events, self._pending = self._pending, []
            return events
        index = self._index_of(data.device)
        event = decode_event(
            index,
            int(data.eventType),
            int(data.eventData),
            mig_id(int(data.gpuInstanceId)),
            mig_id(int(data.computeInstanceId)),
            next(self._sequence),
            self._clock(),
        )
        if event is None:
            return []
        if event.kind is GpuEventKind.GPU_LOST:
            with self._lock:
                self._lost.add(index)
        return [event]

    def close(self) -> None:
        nv = self._nv
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._wait_lock:  # a waiter returns within its timeout; then free the set
            try:
                nv.nvmlEventSetFree(self._events)
            finally:
                nv.nvmlShutdown()

    def _live(self) -> list[int]:
        with self._lock:
            return [i for i in range(len(self._handles)) if i not in self._lost]

    def _index_of(self, handle: Any) -> int:
        nv = self._nv
        try:
            return int(nv.nvmlDeviceGetIndex(handle))
        except nv.NVMLError:  # a lost GPU may not answer; -1 means "some GPU"
            return -1

    def _note_error(self, index: int, err: BaseException) -> None:
        """Remember a lost GPU once and queue its GPU_LOST event; other errors pass."""
        if not is_gpu_lost(err):
            return
        with self._lock:
            if index in self._lost:
                return
            self._lost.add(index)
            self._pending.append(lost_event(index, next(self._sequence), self._clock()))
