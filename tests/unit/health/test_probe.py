"""The node probe shell on a real NATS server with the simulated GPU: each fault is
reported once whichever sources see it, kernel-log lines map to GPUs by PCI address,
counters are polled, and a registration carries the health check."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.health.probe import NodeProbe
from services.health.sim_backend import SimulatedGpuBackend
from shared.api import AGENT_PREFIX, AgentReply, InjectFault
from shared.bus import Bus
from shared.events import GpuXidObserved, NodeRegistered, decode


class Heard:
    """Every event the probe publishes, as a core-NATS subscriber sees it."""

    def __init__(self) -> None:
        self.events: list[object] = []
        self.changed = asyncio.Event()

    def add(self, event: object) -> None:
        self.events.append(event)
        self.changed.set()

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [e for e in self.events if isinstance(e, kind)]

    async def wait(self, ok: Callable[[Heard], bool], timeout: float = 15.0) -> None:
        async with asyncio.timeout(timeout):
            while not ok(self):
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def probe_on(
    nats_url: str, backend: SimulatedGpuBackend, **options: Any
) -> AsyncIterator[tuple[NodeProbe, Heard, Client]]:
    bus = await Bus.connect(nats_url, name="probe-test")
    await bus.ensure_streams()
    heard = Heard()
    nc = await nats.connect(nats_url)

    async def on(msg: Msg) -> None:
        heard.add(decode(msg.data))

    for subject in ("muster.gpu.>", "muster.node.>"):
        await nc.subscribe(subject, cb=on)
    await nc.flush()  # the server knows the subscriptions before the probe publishes
    probe = NodeProbe(
        bus, backend, node="n1", address="127.0.0.1", topology=(), heartbeat_s=0.2, **options
    )
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    try:
        await heard.wait(lambda h: bool(h.of(NodeRegistered)))
        yield probe, heard, nc
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)  # bounds for a loaded 2-core CI machine
        backend.close()
        await nc.close()
        await bus.close()


async def test_an_xid_seen_by_nvml_and_the_kernel_log_is_reported_once(nats_url: str) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=4)
    async with probe_on(nats_url, backend) as (_, heard, _nc):
        backend.inject_xid(2, 79)
        await heard.wait(lambda h: bool(h.of(GpuXidObserved)))
        await asyncio.sleep(0.5)  # the kernel line arrives too; it must be dropped
    [xid] = heard.of(GpuXidObserved)
    assert (xid.node, xid.gpu, xid.xid, xid.source) == ("n1", 2, 79, "nvml")


async def test_a_kernel_log_file_line_maps_to_the_gpu_by_pci_address(
    nats_url: str, tmp_path: Path
) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=4)
    log = tmp_path / "kmsg"
    log.write_text("old line from before the probe started\n")
    async with probe_on(nats_url, backend, kmsg_path=str(log)) as (_, heard, _nc):
        await asyncio.sleep(0.2)  # the follower starts at the end of the file
        # NVML spells PCI slots differently: the line names 0000:38:00, GPU 2 of 4.
        line = "6,1234,5678,-;NVRM: Xid (PCI:0000:38:00): 13, pid=4242, name=python, Graphics"
        with log.open("a") as f:
            f.write(line + "\n")
        await heard.wait(lambda h: bool(h.of(GpuXidObserved)))
    [xid] = heard.of(GpuXidObserved)
    assert (xid.gpu, xid.xid, xid.source, xid.pid) == (2, 13, "kmsg", 4242)


async def test_counters_the_driver_raised_without_an_event_are_reported(nats_url: str) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=2)
    async with probe_on(nats_url, backend, poll_s=0.1) as (_, heard, _nc):
        backend.raise_counter(1, "ecc_uncorrected_volatile", 3)
        await heard.wait(lambda h: bool(h.of(GpuXidObserved)))
    [xid] = heard.of(GpuXidObserved)
    assert (xid.gpu, xid.xid, xid.source) == (1, 48, "counters")


async def test_a_reset_runs_the_health_check_and_registers_again(nats_url: str) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=2)
    backend.set_nvlink(0, 1, False)
    async with probe_on(nats_url, backend) as (probe, heard, nc):
        [first] = heard.of(NodeRegistered)
        assert first.check_passed is False and first.unhealthy_gpus == (0,)
        assert "NVLink" in first.check_problems[0]
        raw = await nc.request(
            f"{AGENT_PREFIX}n1.reset", msgspec.json.encode(InjectFault(gpu=0)), timeout=5
        )
        reply = msgspec.json.decode(raw.data, type=AgentReply)
        assert reply.ok and "check passed" in reply.message
        await heard.wait(lambda h: len(h.of(NodeRegistered)) == 2)
        second = heard.of(NodeRegistered)[1]
        assert second.check_passed is True and second.boot_id == first.boot_id == probe.boot_id


async def test_a_reboot_registers_a_new_boot_and_a_lost_gpu_fails_the_check(
    nats_url: str,
) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=2)
    async with probe_on(nats_url, backend) as (_, heard, nc):
        backend.lose_gpu(1)
        await heard.wait(lambda h: bool(h.of(GpuXidObserved)))
        assert heard.of(GpuXidObserved)[0].xid == 79
        await nc.request(f"{AGENT_PREFIX}n1.reboot", b"{}", timeout=5)
        await heard.wait(lambda h: len(h.of(NodeRegistered)) == 2)
    first, second = heard.of(NodeRegistered)
    assert second.boot_id != first.boot_id and second.check_passed is True
    assert [g.index for g in second.gpus] == [0, 1]


@pytest.mark.parametrize("xid", [13, 79])
async def test_a_second_fault_of_the_same_kind_within_the_window_is_a_repeat(
    nats_url: str, xid: int
) -> None:
    backend = SimulatedGpuBackend("n1", gpu_count=2)
    async with probe_on(nats_url, backend) as (_, heard, _nc):
        backend.inject_xid(0, xid)
        backend.inject_xid(0, xid)
        backend.inject_xid(1, xid)
        await heard.wait(lambda h: len(h.of(GpuXidObserved)) == 2)
        await asyncio.sleep(0.3)
    assert sorted(e.gpu for e in heard.of(GpuXidObserved)) == [0, 1]
