"""Service test on a real NATS server: a node agent's registration rides out a JetStream
that cannot store it yet (its stream missing, or electing a leader in a fail-over, as
in soak seed 415) instead of ending the agent; it lands once, when the stream is back."""

from __future__ import annotations

import asyncio

import pytest

from services.health.probe import NodeProbe
from services.health.sim_backend import SimulatedGpuBackend
from shared.bus import STREAM, Bus


@pytest.mark.timeout(120)
async def test_a_registration_is_published_once_the_stream_can_take_it(nats_url: str) -> None:
    bus = await Bus.connect(nats_url, name="probe-register")
    backend = SimulatedGpuBackend("node07", gpu_count=2, model="SIM-H100")
    probe = NodeProbe(
        bus, backend, node="node07", address="127.0.0.1", topology=("spine0", "leaf1"),
        heartbeat_s=1.0, expected_gpus=2,
    )  # fmt: skip
    try:
        # No stream captures the subject yet: JetStream cannot acknowledge the event.
        registering = asyncio.create_task(probe.register())
        await asyncio.sleep(1.5)
        assert not registering.done(), "the registration gave up, or went nowhere"
        await bus.ensure_streams()
        result = await asyncio.wait_for(registering, 60)
        assert result.passed
        info = await bus.js.stream_info(STREAM)
        assert info.state.messages == 1  # published once, though tried several times
        msg = await bus.js.get_last_msg(STREAM, "muster.node.registered.node07")
        assert msg.data is not None
        assert b'"node07"' in msg.data
    finally:
        backend.close()
        await bus.close()
