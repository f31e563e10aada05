"""The simulated GPU backend: contract, fault scripting, and the threading promise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from services.health.gpu import GpuBackend, GpuCounters, GpuEvent, GpuEventKind
from services.health.sim_backend import Action, SimulatedGpuBackend, sim_pci_address
from services.health.xid import parse_xid_line


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sim(**kw: object) -> SimulatedGpuBackend:
    return SimulatedGpuBackend("node-a", **kw)  # type: ignore[arg-type]


def action(act: Callable[[SimulatedGpuBackend], object]) -> Action:
    """`act` as `schedule` takes it: what it returns (the event) is not looked at."""

    def run(backend: SimulatedGpuBackend) -> None:
        act(backend)

    return run


def test_it_implements_the_backend_protocol() -> None:
    assert isinstance(sim(), GpuBackend)


def test_inventory_is_deterministic_with_distinct_addresses_and_locality_groups() -> None:
    inv = sim(gpu_count=8, locality_groups=2).inventory()
    assert [g.index for g in inv] == list(range(8))
    assert len({g.pci for g in inv}) == 8 and len({g.uuid for g in inv}) == 8
    assert [g.locality for g in inv] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert inv == sim(gpu_count=8, locality_groups=2).inventory()
    assert inv[0].model == "SIM-H100" and inv[0].memory_mib == 81559


def test_addresses_stay_unique_past_sixteen_gpus() -> None:
    assert len({sim_pci_address(i) for i in range(64)}) == 64


def test_an_injected_xid_is_an_event_and_a_parsable_kernel_line() -> None:
    b = sim(clock=FakeClock())
    b.inject_xid(3, 13, pid=42, name="python")
    [event] = b.wait_events(0)
    assert (event.index, event.kind, event.xid, event.at_monotonic) == (
        3,
        GpuEventKind.XID,
        13,
        100.0,
    )
    [line] = b.take_kernel_lines()
    record = parse_xid_line(line)
    assert record is not None
    assert (record.pci, record.xid, record.pid, record.process) == (
        b.inventory()[3].pci,
        13,
        42,
        "python",
    )
    assert b.take_kernel_lines() == []


def test_kmsg_line_for_renders_without_logging() -> None:
    b = sim()
    line = b.kmsg_line_for(0, 79, pid=7, name="torchrun")
    assert line.startswith("NVRM: Xid (PCI:0000:18:00): 79, pid=7, name=torchrun, ")
    assert b.take_kernel_lines() == []


def test_a_recovery_action_on_an_xid_also_sets_the_counter() -> None:
    b = sim()
    b.inject_xid(1, 94, recovery_action=4)
    assert b.wait_events(0)[0].recovery_action == 4
    assert b.counters()[1].recovery_action == 4


def test_set_recovery_action_is_an_xid_154_event() -> None:
    b = sim()
    b.set_recovery_action(2, 1)
    [event] = b.wait_events(0)
    assert (event.kind, event.xid, event.recovery_action) == (GpuEventKind.RECOVERY_ACTION, 154, 1)


def test_a_lost_gpu_goes_silent_and_reports_once() -> None:
    b = sim(gpu_count=4)
    b.lose_gpu(2)
    assert [e.kind for e in b.wait_events(0)] == [GpuEventKind.GPU_LOST]
    assert [c.index for c in b.counters()] == [0, 1, 3]
    assert [g.index for g in b.inventory()] == [0, 1, 3]
    assert b.wait_events(0) == []


def test_raise_counter_sets_one_field_and_rejects_unknown_ones() -> None:
    b = sim()
    b.raise_counter(0, "ecc_uncorrected_volatile", 2)
    b.raise_counter(0, "pending_remaps", 1)
    assert b.counters()[0] == GpuCounters(
        index=0, ecc_uncorrected_volatile=2, pending_remaps=1, temperature_c=35
    )
    with pytest.raises(ValueError, match="unknown counter"):
        b.raise_counter(0, "index", 5)
    with pytest.raises(IndexError, match="no GPU 9"):
        b.raise_counter(9, "temperature_c", 5)


def test_reset_heals_one_gpu_and_applies_pending_remaps() -> None:
    b = sim(gpu_count=2)
    b.lose_gpu(0)
    b.raise_counter(1, "pending_remaps", 1)
    b.raise_counter(1, "ecc_uncorrected_volatile", 3)
    b.set_nvlink(1, 0, False)
    b.reset(0)
    b.reset(1)
    assert [c.index for c in b.counters()] == [0, 1]
    assert b.counters()[1] == GpuCounters(index=1, remapped_rows=1, temperature_c=35)
    assert all(b.inventory()[1].nvlink_up)


def test_reboot_heals_everything_and_forgets_queued_events() -> None:
    b = sim(gpu_count=2)
    b.lose_gpu(0)
    b.inject_xid(1, 48)
    b.reboot()
    assert b.wait_events(0) == [] and b.take_kernel_lines() == []
    assert len(b.counters()) == 2 and b.boots == 1


def test_scheduled_faults_fire_when_due_on_the_backend_clock() -> None:
    clock = FakeClock()
    b = sim(clock=clock)
    b.schedule(5.0, action(lambda s: s.inject_xid(0, 79)))
    b.schedule(1.0, action(lambda s: s.lose_gpu(1)))
    b.run_due()
    assert b.wait_events(0) == []
    clock.now += 1.0
    assert [e.kind for e in b.wait_events(0)] == [GpuEventKind.GPU_LOST]
    clock.now += 4.0
    assert [e.xid for e in b.wait_events(0)] == [79]


def test_sequences_increase() -> None:
    b = sim()
    for xid in (13, 31, 43):
        b.inject_xid(0, xid)
    assert [e.sequence for e in b.wait_events(0)] == [1, 2, 3]


def _waiter(
    b: SimulatedGpuBackend, timeout_ms: int, out: list[tuple[list[GpuEvent], float]]
) -> threading.Thread:
    def run() -> None:
        events = b.wait_events(timeout_ms)
        out.append((events, time.monotonic()))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    time.sleep(0.05)  # let it block
    return t


def test_wait_events_wakes_promptly_on_injection_from_another_thread() -> None:
    b = sim()
    out: list[tuple[list[GpuEvent], float]] = []
    t = _waiter(b, 5000, out)
    injected = time.monotonic()
    b.inject_xid(4, 79)
    t.join(2.0)
    [(events, woke)] = out
    assert [e.xid for e in events] == [79]
    # woken by the injection, not by its 5 s timeout (the speed itself is
    # bench/fault_detection.py's to measure: a loaded machine may delay a thread)
    assert woke - injected < 1.0


def test_close_wakes_a_blocked_waiter_with_nothing() -> None:
    b = sim()
    out: list[tuple[list[GpuEvent], float]] = []
    t = _waiter(b, 5000, out)
    b.close()
    t.join(2.0)
    assert out[0][0] == []
    assert b.wait_events(1000) == []


def test_wait_events_times_out_empty() -> None:
    start = time.monotonic()
    assert sim().wait_events(30) == []
    assert 0.02 <= time.monotonic() - start < 1.0


def test_a_scheduled_fault_wakes_a_waiter_on_the_real_clock() -> None:
    b = sim()
    b.schedule(0.05, action(lambda s: s.inject_xid(0, 48)))
    start = time.monotonic()
    events = b.wait_events(2000)
    assert [e.xid for e in events] == [48]
    assert time.monotonic() - start < 0.5
