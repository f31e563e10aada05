"""The monitor's multi-node exclusion (monitor_links.py): a fabric fault whose action is
`exclude_multi_node` keeps the node UP, flagged for the placer and named in its reason,
until the probe says the link is stable again; and the probe's health check does not
fail on such a fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.health.catalog import classify_fabric
from services.health.fabric import FabricWatcher
from services.health.fabric_core import FabricCondition, FabricPolicy
from services.health.monitor_core import (
    AnyObservation,
    ClusterHealth,
    FabricCleared,
    FabricFaultSeen,
    HealthPolicy,
    NodeHealth,
    NodeState,
    OperatorDrain,
    OperatorResume,
    Transition,
    TransitionKind,
    step,
)
from tests.unit.health.test_fabric import fake_port

A, B = "mlx5_0/1", "mlx5_1/1"
SLOW = "speed degraded: 100 of 200 Gb/s"
ERRS = "errors rising: 80 errors in 60s"


def seen(link: str, cond: str, detail: str, faulted: tuple[str, ...] = ()) -> FabricFaultSeen:
    c = classify_fabric(link, cond, detail)
    return FabricFaultSeen(node="n1", classification=c, faulted=faulted or (link,))


def cleared(link: str, *still: str) -> FabricCleared:
    return FabricCleared(node="n1", link=link, faulted=still)


DEGRADED = seen(A, "speed_degraded", "100 of 200 Gb/s")

# name -> (observations, want (state, multi_node_excluded, reason), want transition kinds)
CASES: dict[str, tuple[list[AnyObservation], tuple[object, ...], list[TransitionKind]]] = {
    "a link trained down keeps the node UP, out of multi-node jobs, and says which": (
        [DEGRADED],
        (NodeState.UP, {A: SLOW}, f"multi-node excluded: {A} {SLOW}"),
        [TransitionKind.NODE_FAULT],
    ),
    "errors rising on a link do the same": (
        [seen(A, "errors_rising", "80 errors in 60s")],
        (NodeState.UP, {A: ERRS}, f"multi-node excluded: {A} {ERRS}"),
        [TransitionKind.NODE_FAULT],
    ),
    "the link stable again lifts the exclusion and its reason": (
        [DEGRADED, cleared(A)],
        (NodeState.UP, {}, ""),
        [TransitionKind.NODE_FAULT],
    ),
    "two links at fault: one stable again leaves the other's exclusion": (
        [DEGRADED, seen(B, "errors_rising", "80 errors in 60s", (A, B)), cleared(A, B)],
        (NodeState.UP, {B: ERRS}, f"multi-node excluded: {B} {ERRS}"),
        [TransitionKind.NODE_FAULT, TransitionKind.NODE_FAULT],
    ),
    "a report whose faulted links no longer name a link drops that link's exclusion": (
        [DEGRADED, seen(B, "errors_rising", "80 errors in 60s", (B,))],
        (NodeState.UP, {B: ERRS}, f"multi-node excluded: {B} {ERRS}"),
        [TransitionKind.NODE_FAULT, TransitionKind.NODE_FAULT],
    ),
    "the flagged link going down drains the node; stable again, it is UP and unflagged": (
        [DEGRADED, seen(A, "link_down", "down for 2.0s"), cleared(A)],
        (NodeState.UP, {}, f"fabric link {A} stable again"),
        [TransitionKind.NODE_FAULT, TransitionKind.NODE_FAULT, TransitionKind.NODE_RECOVERED],
    ),
    "a drained node keeps its drain reason while flagged": (
        [OperatorDrain(node="n1", by="ops", reason="maintenance"), DEGRADED],
        (NodeState.DRAINING, {A: SLOW}, "drained by ops: maintenance"),
        [TransitionKind.NODE_DRAINING, TransitionKind.NODE_FAULT],
    ),
    "an operator's resume lifts every exclusion": (
        [DEGRADED, OperatorResume(node="n1", by="ops")],
        (NodeState.UP, {}, ""),
        [TransitionKind.NODE_FAULT],
    ),
    "a restarted agent's first round restates its faulted links: the rest are dropped": (
        [DEGRADED, seen(B, "errors_rising", "80 errors in 60s", (A, B)), cleared("", B)],
        (NodeState.UP, {B: ERRS}, f"multi-node excluded: {B} {ERRS}"),
        [TransitionKind.NODE_FAULT, TransitionKind.NODE_FAULT],
    ),
    "a damped bounce flags nothing": (
        [seen(A, "link_bounced", "down 0.5s, damped")],
        (NodeState.UP, {}, ""),
        [],
    ),
}


@pytest.mark.parametrize(("observations", "want", "kinds"), CASES.values(), ids=CASES.keys())
def test_multi_node_exclusion(
    observations: list[AnyObservation], want: tuple[object, ...], kinds: list[TransitionKind]
) -> None:
    node = NodeHealth(name="n1", since=0.0, last_heartbeat=0.0, running=1)
    state = ClusterHealth(policy=HealthPolicy(), nodes={"n1": node})
    out: list[Transition] = []
    for t, obs in enumerate(observations, start=1):
        state, moved = step(state, obs, float(t))
        out.extend(moved)
    got = state.nodes["n1"]
    assert (got.state, got.multi_node_excluded, got.reason) == want
    assert [t.kind for t in out] == kinds


async def test_a_degraded_link_is_a_fault_that_fails_no_health_check(tmp_path: Path) -> None:
    port = fake_port(tmp_path, "mlx5_0", "1")
    now = [0.0]
    w = FabricWatcher(names=("mlx5_0",), root=tmp_path, policy=FabricPolicy(), clock=lambda: now[0])
    await w.sample()
    (port / "rate").write_text("100 Gb/sec (4X HDR)\n")
    now[0] = 1.0
    await w.sample()
    assert w.faults() == {A: (FabricCondition.SPEED_DEGRADED, "100 of 200 Gb/s")}
    assert w.problems() == ()  # the node is healthy for single-node work


def test_muster_nodes_shows_a_flagged_node_up_with_the_link_in_its_reason() -> None:
    from muster.render import nodes_lines
    from shared.api import NodesReply, NodeView

    reason = f"multi-node excluded: {A} {SLOW}"
    node = NodeView(
        name="node01", state="UP", reason=reason, gpus_total=8, gpus_free=8,
        topology=("spine0", "leaf1"), last_heartbeat=None,
        last_fault={"link": A, "class": "network_degraded"},
    )  # fmt: skip
    [_, line] = nodes_lines(NodesReply(nodes=(node,)))
    assert line.split()[:3] == ["node01", "UP", "8/8"] and line.endswith(reason)
