"""The NVML path without a GPU: its pure parts on plain data, and the backend driven
through a fake of the pynvml module (passed to the constructor) that raises pynvml's
own error classes."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from services.health.gpu import (
    GpuBackend,
    GpuBackendError,
    GpuCounters,
    GpuEvent,
    GpuEventKind,
    PciAddress,
)
from services.health.nvml_backend import (
    NvmlGpuBackend,
    decode_event,
    dense_groups,
    is_gpu_lost,
    is_timeout,
    locality_groups,
    mig_id,
)

S, M, N, X = 10, 20, 40, 50  # SINGLE, MULTIPLE, NODE (same socket), SYSTEM

GROUPS: dict[str, tuple[list[list[int]], set[tuple[int, int]], list[int]]] = {
    "an HGX board: across sockets but all NVLinked is one group": (
        [[0, N, X, X], [N, 0, X, X], [X, X, 0, N], [X, X, N, 0]],
        {(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)},
        [0, 0, 0, 0],
    ),
    "a PCIe server: GPUs under one switch pair up": (
        [[0, S, N, N], [S, 0, N, N], [N, N, 0, S], [N, N, S, 0]],
        set(),
        [0, 0, 2, 2],
    ),
    "several switches or the host bridge are not close": (
        [[0, M], [M, 0]],
        set(),
        [0, 1],
    ),
    "closeness is transitive": (
        [[0, S, X], [S, 0, S], [X, S, 0]],
        set(),
        [0, 0, 0],
    ),
    "an NVLink bridge joins GPUs across sockets": (
        [[0, X, X], [X, 0, X], [X, X, 0]],
        {(2, 0)},
        [0, 1, 0],
    ),
    "no GPUs": ([], set(), []),
}


@pytest.mark.parametrize(("levels", "nvlinked", "want"), GROUPS.values(), ids=GROUPS.keys())
def test_locality_groups(
    levels: list[list[int]], nvlinked: set[tuple[int, int]], want: list[int]
) -> None:
    assert locality_groups(levels, nvlinked) == want


def test_dense_groups_numbers_from_zero() -> None:
    assert dense_groups([0, 0, 2, 2, 5]) == [0, 0, 1, 1, 2]


NONE32 = 0xFFFFFFFF
EVENTS: dict[str, tuple[tuple[int, int, int | None, int | None], GpuEvent | None]] = {
    "a critical xid carries the xid in eventData": (
        (pynvml.nvmlEventTypeXidCriticalError, 79, None, None),
        GpuEvent(index=1, kind=GpuEventKind.XID, xid=79, sequence=7, at_monotonic=2.0),
    ),
    "a MIG xid names the instances": (
        (pynvml.nvmlEventTypeXidCriticalError, 13, 3, 0),
        GpuEvent(
            index=1,
            kind=GpuEventKind.XID,
            xid=13,
            gpu_instance=3,
            compute_instance=0,
            sequence=7,
            at_monotonic=2.0,
        ),
    ),
    "GPU unavailable is a lost GPU": (
        (pynvml.nvmlEventTypeGpuUnavailableError, 0, None, None),
        GpuEvent(index=1, kind=GpuEventKind.GPU_LOST, xid=79, sequence=7, at_monotonic=2.0),
    ),
    "a recovery action event carries the action": (
        (pynvml.nvmlEventTypeGpuRecoveryAction, 2, None, None),
        GpuEvent(
            index=1,
            kind=GpuEventKind.RECOVERY_ACTION,
            xid=154,
            recovery_action=2,
            sequence=7,
            at_monotonic=2.0,
        ),
    ),
    "an event type we did not ask for is dropped": (
        (pynvml.nvmlEventTypePState, 0, None, None),
        None,
    ),
}


@pytest.mark.parametrize(("raw", "want"), EVENTS.values(), ids=EVENTS.keys())
def test_decode_event(raw: tuple[int, int, int | None, int | None], want: GpuEvent | None) -> None:
    event_type, data, gi, ci = raw
    assert decode_event(1, event_type, data, gi, ci, sequence=7, at=2.0) == want


def test_mig_id_maps_the_none_marker() -> None:
    assert (mig_id(NONE32), mig_id(4)) == (None, 4)


ERRORS: dict[str, tuple[BaseException, bool, bool]] = {
    "GpuIsLost counts as xid 79": (pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST), True, False),
    "the subclass too": (pynvml.NVMLError_GpuIsLost(), True, False),
    "a timeout is only a timeout": (pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT), False, True),
    "not supported is neither": (pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), False, False),
    "a foreign exception is neither": (ValueError("x"), False, False),
}


@pytest.mark.parametrize(("error", "lost", "timeout"), ERRORS.values(), ids=ERRORS.keys())
def test_error_mapping(error: BaseException, lost: bool, timeout: bool) -> None:
    assert (is_gpu_lost(error), is_timeout(error)) == (lost, timeout)


# -- the backend through a fake NVML ---------------------------------------------------


def err(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


class FakeNvml:
    """Enough of pynvml for the backend: handles are GPU indexes."""

    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeGpuUnavailableError = pynvml.nvmlEventTypeGpuUnavailableError
    nvmlEventTypeGpuRecoveryAction = pynvml.nvmlEventTypeGpuRecoveryAction
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self, gpus: int = 2, links: int = 2, init_error: int | None = None) -> None:
        self.gpus, self.links, self.init_error = gpus, links, init_error
        self.lost: set[int] = set()
        self.queue: list[SimpleNamespace | BaseException] = []
        self.registered: dict[int, int] = {}
        self.calls: list[str] = []

    def _alive(self, h: int) -> None:
        if h in self.lost:
            raise err(pynvml.NVML_ERROR_GPU_IS_LOST)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise err(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, s: str) -> None:
        self.calls.append("free")

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        mask: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuRecoveryAction
        return mask

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, s: str) -> None:
        self.registered[h] = mask

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        self._alive(h)
        return f"GPU-{h:08x}".encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=81559 * 1024 * 1024)

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(domain=0, bus=0x18 + 0x10 * h, device=0)

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= self.links:
            raise err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return X

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        assert index == 2  # NVLINK; READ would be the tuple (0,) in this pynvml
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        self._alive(h)
        return 0

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return (3, 1, 1, 0)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        raise err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetFieldValues(self, h: int, ids: list[int]) -> list[SimpleNamespace]:
        assert ids == [230]
        return [SimpleNamespace(nvmlReturn=0, value=SimpleNamespace(uiVal=0))]

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> SimpleNamespace:
        if not self.queue:
            raise err(pynvml.NVML_ERROR_TIMEOUT)
        item = self.queue.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


def xid_data(h: int, xid: int) -> SimpleNamespace:
    return SimpleNamespace(
        device=h,
        eventType=pynvml.nvmlEventTypeXidCriticalError,
        eventData=xid,
        gpuInstanceId=NONE32,
        computeInstanceId=NONE32,
    )


def backend(fake: FakeNvml) -> NvmlGpuBackend:
    return NvmlGpuBackend(clock=lambda: 5.0, nvml=fake)


def test_the_nvml_backend_implements_the_protocol() -> None:
    assert isinstance(backend(FakeNvml()), GpuBackend)


def test_init_failure_is_a_backend_error_with_the_nvml_code() -> None:
    with pytest.raises(GpuBackendError, match="NVML init failed") as info:
        backend(FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    assert info.value.code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED


def test_only_supported_event_types_are_registered() -> None:
    fake = FakeNvml()
    backend(fake)
    want = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeGpuRecoveryAction
    assert fake.registered == {0: want, 1: want}


def test_inventory_reads_integers_text_and_links() -> None:
    inv = backend(FakeNvml(links=3)).inventory()
    assert [(g.index, g.uuid, g.pci, g.memory_mib, g.nvlink_up, g.locality) for g in inv] == [
        (0, "GPU-00000000", PciAddress(bus=0x18, device=0), 81559, (True,) * 3, 0),
        (1, "GPU-00000001", PciAddress(bus=0x28, device=0), 81559, (True,) * 3, 0),
    ]


def test_counters_read_ecc_remaps_and_recovery_action() -> None:
    assert backend(FakeNvml(gpus=1)).counters() == (
        GpuCounters(index=0, remapped_rows=1, pending_remaps=1, recovery_action=0),
    )


def test_wait_events_decodes_an_xid_and_times_out_empty() -> None:
    fake = FakeNvml()
    b = backend(fake)
    fake.queue.append(xid_data(1, 48))
    assert b.wait_events(100) == [
        GpuEvent(index=1, kind=GpuEventKind.XID, xid=48, sequence=1, at_monotonic=5.0)
    ]
    assert b.wait_events(100) == []


def test_a_gpu_lost_in_a_poll_leaves_the_poll_and_is_reported_once() -> None:
    fake = FakeNvml()
    b = backend(fake)
    fake.lost.add(0)
    assert [c.index for c in b.counters()] == [1]
    assert [g.index for g in b.inventory()] == [1]
    assert [(e.index, e.kind, e.xid) for e in b.wait_events(100)] == [
        (0, GpuEventKind.GPU_LOST, 79)
    ]
    b.counters()
    assert b.wait_events(100) == []


def test_gpu_is_lost_from_the_event_wait_is_found_by_a_poll() -> None:
    fake = FakeNvml()
    b = backend(fake)
    fake.lost.add(1)
    fake.queue.append(err(pynvml.NVML_ERROR_GPU_IS_LOST))
    assert [(e.index, e.xid) for e in b.wait_events(100)] == [(1, 79)]


def test_other_nvml_errors_from_the_wait_propagate() -> None:
    fake = FakeNvml()
    b = backend(fake)
    fake.queue.append(err(pynvml.NVML_ERROR_UNKNOWN))
    with pytest.raises(pynvml.NVMLError):
        b.wait_events(100)


def test_close_frees_once_and_later_waits_return_nothing() -> None:
    fake = FakeNvml()
    b = backend(fake)
    b.close()
    b.close()
    assert fake.calls == ["free", "shutdown"]
    assert b.wait_events(100) == []


def test_the_real_module_fails_cleanly_without_a_driver_and_works_with_one() -> None:
    try:
        b = NvmlGpuBackend()
    except GpuBackendError as e:  # this machine: no libnvidia-ml
        assert "NVML" in str(e)
        return
    try:  # pragma: no cover - a machine with a GPU
        assert len(b.inventory()) == len(b.counters())
        b.wait_events(10)
    finally:
        b.close()
