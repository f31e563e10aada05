"""The probe's fabric path on a real NATS server, over a fake sysfs tree read by the same
code as the real one: a port down is reported once, named; a node that registered with
its link down fails its check, and registers again with a passing check once the link
is back and the fault cleared after the stable period."""

from __future__ import annotations

import itertools
from pathlib import Path

from services.health.fabric import FabricWatcher
from services.health.fabric_core import FabricPolicy
from services.health.sim_backend import SimulatedGpuBackend
from shared.events import NodeFabricFaultObserved, NodeRegistered
from tests.unit.health.test_fabric import fake_port
from tests.unit.health.test_probe import probe_on


async def test_a_port_down_at_registration_fails_the_check_until_the_link_is_stable(
    nats_url: str, tmp_path: Path
) -> None:
    port = fake_port(tmp_path, "mlx5_0", "1", state="1: DOWN")
    ticks = itertools.count()
    watcher = FabricWatcher(
        names=("mlx5_0",),  # named: judged from the start, down or not
        root=tmp_path,
        policy=FabricPolicy(down_grace_s=2, stable_s=3),
        poll_s=0.05,
        clock=lambda: float(next(ticks)) / 10,  # every reading is 0.1 s later
    )
    await watcher.sample()  # what the agent saw before it registered
    backend = SimulatedGpuBackend("n1", gpu_count=1)
    async with probe_on(nats_url, backend, fabric=watcher) as (_, heard, _nc):
        [first] = heard.of(NodeRegistered)
        assert not first.check_passed
        assert first.check_problems == ("fabric mlx5_0/1: down",)

        await heard.wait(lambda h: bool(h.of(NodeFabricFaultObserved)), timeout=30)
        [down] = heard.of(NodeFabricFaultObserved)
        assert (down.link, down.condition, down.cleared) == ("mlx5_0/1", "link_down", False)
        assert down.faulted == ("mlx5_0/1",)

        (port / "state").write_text("4: ACTIVE\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        await heard.wait(lambda h: len(h.of(NodeRegistered)) == 2, timeout=30)
        cleared = heard.of(NodeFabricFaultObserved)[-1]
        assert (cleared.cleared, cleared.faulted) == (True, ())
        assert heard.of(NodeRegistered)[-1].check_passed
