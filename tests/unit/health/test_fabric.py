"""The fabric reader on a fake sysfs tree (the same code reads the real one), the site
hook's output, the monitor's fabric classification and state machine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from services.health.catalog import FabricAction, FabricClass, classify_fabric
from services.health.fabric import (
    FabricWatcher,
    detect_hcas,
    parse_fabric,
    parse_hook_output,
    read_links,
)
from services.health.fabric_core import FabricCondition, FabricPolicy, FabricReport, LinkKind
from services.health.monitor_core import (
    ClusterHealth,
    FabricCleared,
    FabricFaultSeen,
    HealthPolicy,
    Heartbeat,
    NodeHealth,
    NodeState,
    Recovery,
    TransitionKind,
    step,
)


def fake_port(root: Path, hca: str, port: str, state: str = "4: ACTIVE", **counters: int) -> Path:
    base = root / "sys/class/infiniband" / hca / "ports" / port
    (base / "counters").mkdir(parents=True, exist_ok=True)
    (base / "state").write_text(state + "\n")
    (base / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
    (base / "rate").write_text("200 Gb/sec (4X HDR)\n")
    for name in ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery"):
        (base / "counters" / name).write_text(f"{counters.get(name, 0)}\n")
    return base


def fake_netdev(root: Path, name: str, carrier: int | None = 1, speed: int = 100000) -> None:
    base = root / "sys/class/net" / name
    base.mkdir(parents=True, exist_ok=True)
    (base / "operstate").write_text("up\n" if carrier else "down\n")
    if carrier is not None:
        (base / "carrier").write_text(f"{carrier}\n")
    (base / "speed").write_text(f"{speed}\n")
    (base / "carrier_changes").write_text("3\n")


def test_hcas_are_detected_and_every_port_read_with_its_counters(tmp_path: Path) -> None:
    fake_port(tmp_path, "mlx5_0", "1", symbol_error=7)
    fake_port(tmp_path, "mlx5_1", "1", state="1: DOWN")
    assert detect_hcas(tmp_path) == ("mlx5_0", "mlx5_1")
    links = {s.link: s for s in read_links(tmp_path, ())}
    assert sorted(links) == ["mlx5_0/1", "mlx5_1/1"]
    up, down = links["mlx5_0/1"], links["mlx5_1/1"]
    assert (up.kind, up.up, up.rate_gbps, up.counters["symbol_error"]) == (
        LinkKind.IB, True, 200.0, 7,
    )  # fmt: skip
    assert not down.up and down.state == "1: DOWN (3: Disabled)"


def test_named_links_are_ports_hcas_or_netdevs_and_a_missing_one_reads_down(
    tmp_path: Path,
) -> None:
    fake_port(tmp_path, "mlx5_0", "1")
    fake_port(tmp_path, "mlx5_0", "2")
    fake_netdev(tmp_path, "ib0")
    fake_netdev(tmp_path, "eth1", carrier=None)  # a down netdev answers EINVAL for carrier
    names = parse_fabric("mlx5_0/2, ib0,eth1 gone0")
    links = {s.link: s for s in read_links(tmp_path, names)}
    assert sorted(links) == ["eth1", "gone0", "ib0", "mlx5_0/2"]
    assert links["ib0"].up and links["ib0"].rate_gbps == 100.0
    assert links["ib0"].carrier_changes == 3
    assert not links["eth1"].up and not links["gone0"].up


async def test_the_watcher_reports_a_port_going_down_in_the_fake_tree(tmp_path: Path) -> None:
    base = fake_port(tmp_path, "mlx5_0", "1")
    now = [0.0]
    seen: list[tuple[FabricReport, str]] = []

    async def report(r: FabricReport, source: str) -> None:
        seen.append((r, source))

    w = FabricWatcher(
        report, root=tmp_path, policy=FabricPolicy(down_grace_s=1, stable_s=5),
        clock=lambda: now[0],
    )  # fmt: skip
    assert w.watching and not w.netlink
    await w.sample()
    (base / "state").write_text("1: DOWN\n")
    now[0] = 1.0
    await w.sample()
    assert w.problems() == ("fabric mlx5_0/1: down",)
    now[0] = 2.5
    await w.sample()
    assert [(r.link, r.condition, r.cleared, src) for r, src in seen] == [
        ("", FabricCondition.RESTATED, True, "sysfs"),  # the first round: what is at fault
        ("mlx5_0/1", FabricCondition.LINK_DOWN, False, "sysfs"),
    ]
    assert w.problems()[0].startswith("fabric mlx5_0/1: link_down")


async def test_the_site_hook_reports_into_the_same_path(tmp_path: Path) -> None:
    hook = tmp_path / "hook"
    hook.write_text(
        '#!/bin/sh\necho \'{"faults": [{"link": "mlx5_0/1", "condition": "sm_down",'
        ' "detail": "SM lost the port"}]}\'\n'
    )
    hook.chmod(0o755)
    fake_port(tmp_path, "mlx5_0", "1")
    seen: list[tuple[str, str, str]] = []

    async def report(r: FabricReport, source: str) -> None:
        seen.append((r.link, str(r.condition), source))

    w = FabricWatcher(report, root=tmp_path, hook=str(hook), hook_s=60, clock=lambda: 0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop))
    try:
        for _ in range(100):
            if any(link for link, _, _ in seen):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task
    assert [s for s in seen if s[0]] == [("mlx5_0/1", "site", "site")]


HOOK_OUTPUTS = {
    "an empty list: all is well": ("[]", {}),
    "nothing printed: all is well": ("", {}),
    "a known condition is kept": (
        '[{"link": "ib0", "condition": "link_down", "detail": "x"}]',
        {"ib0": (FabricCondition.LINK_DOWN, "x")},
    ),
    "an unknown condition counts as the site's": (
        '{"faults": [{"link": "ib0", "condition": "sm says no"}]}',
        {"ib0": (FabricCondition.SITE, "site hook")},
    ),
}


@pytest.mark.parametrize(("raw", "want"), HOOK_OUTPUTS.values(), ids=HOOK_OUTPUTS.keys())
def test_parse_hook_output(raw: str, want: object) -> None:
    assert parse_hook_output(raw) == want


@pytest.mark.parametrize("raw", ["{", '[{"condition": "link_down"}]', '{"faults": 3}'])
def test_unreadable_hook_output_is_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_hook_output(raw)


CLASSES = {
    "down": ("link_down", FabricClass.LINK_DOWN, FabricAction.DRAIN_NODE),
    "flapping": ("link_flapping", FabricClass.LINK_FLAPPING, FabricAction.DRAIN_NODE),
    "errors": ("errors_rising", FabricClass.ERRORS, FabricAction.EXCLUDE_MULTI_NODE),
    "degraded": ("speed_degraded", FabricClass.DEGRADED, FabricAction.EXCLUDE_MULTI_NODE),
    "bounce": ("link_bounced", FabricClass.BOUNCE, FabricAction.WARN),
    "site": ("site", FabricClass.SITE, FabricAction.DRAIN_NODE),
    "unknown drains": ("cosmic_rays", FabricClass.UNKNOWN, FabricAction.DRAIN_NODE),
}


@pytest.mark.parametrize(("cond", "cls", "action"), CLASSES.values(), ids=CLASSES.keys())
def test_classify_fabric(cond: str, cls: FabricClass, action: FabricAction) -> None:
    c = classify_fabric("mlx5_0/1", cond)
    assert (c.fault_class, c.action) == (cls, action)
    assert c.excludes_node == c.affects_job == (action is FabricAction.DRAIN_NODE)


def _cluster(running: int = 1) -> ClusterHealth:
    node = NodeHealth(name="n1", since=0.0, last_heartbeat=0.0, running=running)
    return ClusterHealth(policy=HealthPolicy(), nodes={"n1": node})


def _seen(cond: str) -> FabricFaultSeen:
    return FabricFaultSeen(node="n1", classification=classify_fabric("ib0", cond, "carrier lost"))


def test_a_link_down_drains_the_node_with_a_fault_naming_the_link_until_it_is_stable() -> None:
    state, out = step(_cluster(), _seen("link_down"), 1.0)
    assert [(t.kind, t.to_state) for t in out] == [(TransitionKind.NODE_FAULT, NodeState.DRAINING)]
    assert out[0].fabric is not None and out[0].fabric.link == "ib0"
    assert "ib0" in state.nodes["n1"].reason
    assert state.nodes["n1"].recovery is Recovery.FABRIC
    state, out = step(state, FabricCleared(node="n1", link="ib0", faulted=("mlx5_0/1",)), 2.0)
    assert out == () and state.nodes["n1"].state is NodeState.DRAINING
    state, out = step(state, FabricCleared(node="n1", link="mlx5_0/1"), 3.0)
    assert [(t.kind, t.to_state) for t in out] == [(TransitionKind.NODE_RECOVERED, NodeState.UP)]


def test_a_lesser_fabric_fault_is_published_and_leaves_the_node_up() -> None:
    state, out = step(_cluster(), _seen("speed_degraded"), 1.0)
    assert [(t.kind, t.to_state) for t in out] == [(TransitionKind.NODE_FAULT, NodeState.UP)]
    assert state.nodes["n1"].recovery is Recovery.NONE


def test_a_damped_bounce_changes_nothing() -> None:
    state, out = step(_cluster(), _seen("link_bounced"), 1.0)
    assert out == () and state.nodes["n1"] == _cluster().nodes["n1"]


def test_a_node_faulted_on_its_link_and_silent_returns_draining_not_up() -> None:
    state, _ = step(_cluster(running=0), _seen("link_down"), 1.0)
    assert state.nodes["n1"].state is NodeState.DRAINED
    state, out = step(state, Heartbeat(node="n1", running=0), 2.0)
    assert out == () and state.nodes["n1"].state is NodeState.DRAINED


def test_muster_nodes_names_the_failed_link_of_a_node_out_of_service() -> None:
    from muster.render import nodes_lines
    from shared.api import NodesReply, NodeView

    node = NodeView(
        name="node02", state="DRAINED", reason="network link_down on ib0: down for 2.0s",
        gpus_total=1, gpus_free=1, topology=("spine0", "leaf1"), last_heartbeat=None,
        last_fault={"link": "ib0", "class": "network_link_down"},
    )  # fmt: skip
    [_, line] = nodes_lines(NodesReply(nodes=(node,)))
    assert "link:ib0" in line and "network link_down on ib0" in line
    back = msgspec.structs.replace(node, state="UP", reason="")
    assert "link:" not in nodes_lines(NodesReply(nodes=(back,)))[1]


async def test_autodetected_ports_are_judged_only_once_seen_up(tmp_path: Path) -> None:
    fake_port(tmp_path, "mlx5_0", "1")
    spare = fake_port(tmp_path, "mlx5_0", "2", state="1: DOWN")  # uncabled
    now = [0.0]
    w = FabricWatcher(root=tmp_path, policy=FabricPolicy(down_grace_s=1), clock=lambda: now[0])
    for t in (0.0, 2.0, 4.0):
        now[0] = t
        await w.sample()
    assert w.problems() == () and sorted(w.state.links) == ["mlx5_0/1"]
    (spare / "state").write_text("4: ACTIVE\n")
    (spare / "phys_state").write_text("5: LinkUp\n")
    now[0] = 5.0
    await w.sample()
    (spare / "state").write_text("1: DOWN\n")
    now[0] = 7.0
    await w.sample()
    assert w.problems() == ("fabric mlx5_0/2: down",)
    now[0] = 8.5
    await w.sample()
    assert list(w.faults()) == ["mlx5_0/2"]


def test_a_topology_leaf_names_its_nodes_fabric_for_their_agents(tmp_path: Path) -> None:
    from muster.cluster import Cluster, load_topology

    topo = tmp_path / "topology.toml"
    topo.write_text(
        'fabric = ["mlx5_0"]\n'
        '[[leaf]]\nname = "leaf1"\nnodes = ["n1"]\n'
        '[[leaf]]\nname = "leaf2"\nnodes = ["n2"]\nfabric = ["mlx5_1/1", "ib0"]\n'
    )
    n1, n2 = load_topology(topo)
    assert (n1.fabric, n2.fabric) == (("mlx5_0",), ("mlx5_1/1", "ib0"))
    cluster = Cluster(tmp_path / "state", "nats://127.0.0.1:1", "postgresql://x/y")
    key = cluster.plan_node(n2)
    assert cluster.specs[key].env["MUSTER_FABRIC"] == "mlx5_1/1,ib0"
