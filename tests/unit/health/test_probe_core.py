"""Probe core: NVML + kernel log de-duplication, counter faults, the health check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.health.gpu import GpuCounters, GpuEvent, GpuEventKind, GpuInfo, PciAddress
from services.health.probe_core import (
    CheckResult,
    Dedupe,
    Sighting,
    Source,
    check_health,
    counter_sightings,
    dedupe,
    from_event,
    from_record,
    pci_index,
    recovery_action_in,
)
from services.health.xid import parse_xid_line


def info(index: int, bus: int, links: tuple[bool, ...] = (True, True)) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index}",
        pci=PciAddress(domain=0, bus=bus, device=0, function=0),
        model="H100",
        memory_mib=81559,
        nvlink_up=links,
    )


INVENTORY = (info(0, 0x18), info(1, 0x3B))
BY_PCI = pci_index(INVENTORY)


def test_kernel_lines_map_to_gpu_indexes_by_integers() -> None:
    record = parse_xid_line("NVRM: Xid (PCI:00000000:3B:00): 79, pid=1, name=p, gone")
    assert record is not None
    assert from_record(record, BY_PCI, at=1.0).gpu == 1


def test_a_kernel_line_for_an_unknown_address_keeps_its_address() -> None:
    record = parse_xid_line("NVRM: Xid (PCI:0000:99:00): 79, gone")
    assert record is not None
    s = from_record(record, BY_PCI, at=1.0)
    assert (s.gpu, s.pci) == (None, PciAddress(bus=0x99, device=0))


def test_an_xid_154_line_carries_its_recovery_action() -> None:
    record = parse_xid_line(
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x2 (Node Reboot Required)"
    )
    assert record is not None
    s = from_record(record, BY_PCI, at=0.0)
    assert (s.gpu, s.recovery_action, s.classification.action.value) == (0, 2, "reboot_node")


@pytest.mark.parametrize(
    ("message", "want"),
    [("changed from 0x0 (None) to 0x4 (Drain and Reset)", 4), ("no action here", None)],
    ids=["an action", "none"],
)
def test_recovery_action_in(message: str, want: int | None) -> None:
    assert recovery_action_in(message) == want


def nvml(gpu: int, xid: int, at: float, action: int | None = None) -> Sighting:
    event = GpuEvent(index=gpu, kind=GpuEventKind.XID, xid=xid, recovery_action=action)
    return from_event(event, at)


def kmsg(gpu: int, xid: int, at: float) -> Sighting:
    return Sighting(gpu=gpu, xid=xid, source=Source.KMSG, at=at)


DEDUPE: dict[str, tuple[list[Sighting], list[tuple[int | None, int, Source]]]] = {
    "NVML then the kernel line is one fault": (
        [nvml(0, 79, 1.0), kmsg(0, 79, 1.2)],
        [(0, 79, Source.NVML)],
    ),
    "the kernel line first wins the race just as well": (
        [kmsg(0, 79, 1.0), nvml(0, 79, 1.05)],
        [(0, 79, Source.KMSG)],
    ),
    "a different GPU is a different fault": (
        [nvml(0, 79, 1.0), nvml(1, 79, 1.0)],
        [(0, 79, Source.NVML), (1, 79, Source.NVML)],
    ),
    "a different XID is a different fault": (
        [nvml(0, 13, 1.0), nvml(0, 31, 1.0)],
        [(0, 13, Source.NVML), (0, 31, Source.NVML)],
    ),
    "a repeat after the window is a new fault": (
        [nvml(0, 13, 1.0), nvml(0, 13, 7.0)],
        [(0, 13, Source.NVML), (0, 13, Source.NVML)],
    ),
    "a storm inside the window is one fault": (
        [kmsg(0, 13, 1.0 + i * 0.01) for i in range(100)],
        [(0, 13, Source.KMSG)],
    ),
    "recovery actions that differ are not duplicates": (
        [nvml(0, 154, 1.0, action=4), nvml(0, 154, 1.1, action=2)],
        [(0, 154, Source.NVML), (0, 154, Source.NVML)],
    ),
}


@pytest.mark.parametrize(("sightings", "want"), DEDUPE.values(), ids=DEDUPE.keys())
def test_dedupe(sightings: list[Sighting], want: list[tuple[int | None, int, Source]]) -> None:
    state = Dedupe(window_s=5.0)
    passed = []
    for s in sightings:
        state, out = dedupe(state, s)
        if out is not None:
            passed.append((out.gpu, out.xid, out.source))
    assert passed == want


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5), st.floats(0, 100)), max_size=40))
def test_dedupe_passes_at_most_one_per_key_per_window(raw: list[tuple[int, int, float]]) -> None:
    state = Dedupe(window_s=5.0)
    last: dict[tuple[int, int], float] = {}
    for gpu, xid, at in sorted(raw, key=lambda r: r[2]):
        state, out = dedupe(state, kmsg(gpu, xid, at))
        if out is not None:
            prev = last.get((gpu, xid))
            assert prev is None or at - prev >= 5.0
            last[(gpu, xid)] = at
        else:
            assert at - last[(gpu, xid)] < 5.0


COUNTERS: dict[str, tuple[GpuCounters, GpuCounters, list[tuple[int, int | None]]]] = {
    "nothing changed": (GpuCounters(index=0), GpuCounters(index=0), []),
    "uncorrected ECC rose: a DBE": (
        GpuCounters(index=0, ecc_uncorrected_volatile=1),
        GpuCounters(index=0, ecc_uncorrected_volatile=2),
        [(48, None)],
    ),
    "a remap became pending": (
        GpuCounters(index=0),
        GpuCounters(index=0, pending_remaps=1),
        [(63, None)],
    ),
    "a remap failed": (GpuCounters(index=0), GpuCounters(index=0, remap_failed=True), [(64, None)]),
    "the recovery action changed": (
        GpuCounters(index=0, recovery_action=0),
        GpuCounters(index=0, recovery_action=1),
        [(154, 1)],
    ),
    "a still-pending remap is not news": (
        GpuCounters(index=0, pending_remaps=1),
        GpuCounters(index=0, pending_remaps=1),
        [],
    ),
}


@pytest.mark.parametrize(("before", "after", "want"), COUNTERS.values(), ids=COUNTERS.keys())
def test_counter_sightings(
    before: GpuCounters, after: GpuCounters, want: list[tuple[int, int | None]]
) -> None:
    found = counter_sightings([before], [after], at=3.0)
    assert [(s.xid, s.recovery_action) for s in found] == want
    assert all(s.source is Source.COUNTERS and s.gpu == 0 for s in found)


OK = (GpuCounters(index=0, temperature_c=40), GpuCounters(index=1, temperature_c=41))

CHECKS: dict[str, tuple[tuple[GpuInfo, ...], tuple[GpuCounters, ...], CheckResult]] = {
    "a healthy node passes": (INVENTORY, OK, CheckResult(passed=True)),
    "a missing GPU fails the node": (
        INVENTORY[:1],
        OK[:1],
        CheckResult(passed=False, problems=("1 of 2 GPUs present",)),
    ),
    "uncorrected ECC fails the GPU": (
        INVENTORY,
        (OK[0], GpuCounters(index=1, ecc_uncorrected_volatile=1)),
        CheckResult(
            passed=False, problems=("GPU 1: 1 uncorrected ECC errors",), unhealthy_gpus=(1,)
        ),
    ),
    "a pending recovery action fails the GPU": (
        INVENTORY,
        (GpuCounters(index=0, recovery_action=1), OK[1]),
        CheckResult(
            passed=False, problems=("GPU 0: recovery action 1 pending",), unhealthy_gpus=(0,)
        ),
    ),
    "a pending remap passes but is reported": (
        INVENTORY,
        (OK[0], GpuCounters(index=1, pending_remaps=1)),
        CheckResult(passed=True, reset_pending=(1,)),
    ),
    "a down NVLink fails the GPU": (
        (INVENTORY[0], info(1, 0x3B, links=(True, False))),
        OK,
        CheckResult(passed=False, problems=("GPU 1: NVLink links down: [1]",), unhealthy_gpus=(1,)),
    ),
    "a GPU without counters fails": (
        INVENTORY,
        OK[:1],
        CheckResult(passed=False, problems=("GPU 1: no counters",), unhealthy_gpus=(1,)),
    ),
    "an overheating GPU fails": (
        INVENTORY,
        (OK[0], GpuCounters(index=1, temperature_c=95)),
        CheckResult(passed=False, problems=("GPU 1: temperature 95 C",), unhealthy_gpus=(1,)),
    ),
}


@pytest.mark.parametrize(("inventory", "counters", "want"), CHECKS.values(), ids=CHECKS.keys())
def test_check_health(
    inventory: tuple[GpuInfo, ...], counters: tuple[GpuCounters, ...], want: CheckResult
) -> None:
    assert check_health(2, inventory, counters) == want
