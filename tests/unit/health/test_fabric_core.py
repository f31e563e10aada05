"""The fabric classifier: scripts of samples over time -> the reports it makes."""

from __future__ import annotations

import pytest

from services.health.fabric_core import (
    FabricCondition,
    FabricPolicy,
    FabricReport,
    FabricState,
    LinkKind,
    LinkSample,
    faulted,
    observe,
)

POLICY = FabricPolicy(
    down_grace_s=2.0, flap_window_s=60.0, flap_max=3, stable_s=10.0, error_window_s=30.0,
    error_threshold=10,
)  # fmt: skip
C = FabricCondition


def ib(up: bool = True, rate: float = 200.0, **counters: int) -> LinkSample:
    base = {"symbol_error": 0, "port_rcv_errors": 0, "link_downed": 0}
    return LinkSample(
        link="mlx5_0/1",
        kind=LinkKind.IB,
        up=up,
        state="4: ACTIVE" if up else "1: DOWN",
        rate_gbps=rate,
        counters={**base, **counters},
    )


def eth(up: bool = True, changes: int = 1) -> LinkSample:
    return LinkSample(link="ib0", kind=LinkKind.ETH, up=up, carrier_changes=changes)


def fault(cond: FabricCondition, link: str = "mlx5_0/1") -> tuple[str, FabricCondition, bool]:
    return (link, cond, False)


def cleared(cond: FabricCondition, link: str = "mlx5_0/1") -> tuple[str, FabricCondition, bool]:
    return (link, cond, True)


def bounced(link: str = "mlx5_0/1") -> tuple[str, FabricCondition, bool]:
    return (link, C.LINK_BOUNCED, False)


def run(script: list[tuple[float, LinkSample]]) -> list[tuple[float, tuple[str, C, bool]]]:
    state = FabricState(policy=POLICY)
    out: list[tuple[float, tuple[str, C, bool]]] = []
    for at, sample in script:
        state, reports = observe(state, [sample], at)
        out += [(at, _short(r)) for r in reports]
    return out


def _short(r: FabricReport) -> tuple[str, C, bool]:
    return (r.link, r.condition, r.cleared)


CASES = {
    "a healthy link reports nothing": (
        [(0, ib()), (1, ib()), (2, ib())],
        [],
    ),
    "a link down past the grace is a fault, and clears only after the stable period": (
        [(0, ib()), (1, ib(False)), (2, ib(False)), (3, ib(False)), (4, ib()), (10, ib()),
         (14, ib()), (15, ib())],
        [(3, fault(C.LINK_DOWN)), (14, cleared(C.LINK_DOWN))],
    ),
    "one short bounce is damped: a warning, no fault": (
        [(0, ib()), (1, ib(False)), (2, ib()), (3, ib()), (30, ib())],
        [(2, bounced())],
    ),
    "a bounce back down during the stable period restarts it": (
        [(0, ib()), (1, ib(False)), (4, ib(False)), (5, ib()), (12, ib()), (13, ib(False)),
         (14, ib()), (20, ib()), (24, ib())],
        [(4, fault(C.LINK_DOWN)), (14, bounced()), (24, cleared(C.LINK_DOWN))],
    ),
    "three bounces within the window are flapping, however short": (
        [(0, ib()), (1, ib(False)), (1.5, ib()), (3, ib(False)), (3.5, ib()), (5, ib(False)),
         (5.5, ib())],
        [(1.5, bounced()), (3.5, bounced()), (5, fault(C.LINK_FLAPPING)), (5.5, bounced())],
    ),
    "bounces between two polls are counted from link_downed": (
        [(0, ib()), (1, ib(link_downed=1)), (2, ib(link_downed=3))],
        [(1, bounced()), (2, bounced()), (2, fault(C.LINK_FLAPPING))],
    ),
    "error counters rising past the threshold in the window are a fault": (
        [(0, ib()), (1, ib(symbol_error=4)), (2, ib(symbol_error=8, port_rcv_errors=3))],
        [(2, fault(C.ERRORS_RISING))],
    ),
    "errors spread wider than the window are not": (
        [(0, ib()), (1, ib(symbol_error=6)), (40, ib(symbol_error=12)), (80, ib(symbol_error=18))],
        [],
    ),
    "a link trained down to a lower speed is degraded, and clears at full speed": (
        [(0, ib()), (1, ib(rate=100.0)), (5, ib()), (15, ib())],
        [(1, fault(C.SPEED_DEGRADED)), (15, cleared(C.SPEED_DEGRADED))],
    ),
    "a degraded link that then goes down is escalated": (
        [(0, ib()), (1, ib(rate=100.0)), (2, ib(False)), (4, ib(False))],
        [(1, fault(C.SPEED_DEGRADED)), (4, fault(C.LINK_DOWN))],
    ),
    "an ethernet link counts bounces from carrier_changes (two per bounce)": (
        [(0, eth()), (1, eth(changes=3)), (2, eth(changes=5)), (3, eth(changes=7))],
        [(1, bounced("ib0")), (2, bounced("ib0")), (3, bounced("ib0")),
         (3, fault(C.LINK_FLAPPING, "ib0"))],
    ),
    "an ethernet link losing carrier is down after the grace": (
        [(0, eth()), (1, eth(False, 2)), (3.5, eth(False, 2))],
        [(3.5, fault(C.LINK_DOWN, "ib0"))],
    ),
    "a link down from the first sample is a fault after the grace": (
        [(0, ib(False)), (1, ib(False)), (2, ib(False))],
        [(2, fault(C.LINK_DOWN))],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("script", "want"), CASES.values(), ids=CASES.keys())
def test_observe(script: list[tuple[float, LinkSample]], want: list[object]) -> None:
    assert run(script) == want


def test_a_site_verdict_holds_like_a_condition_and_clears_after_the_stable_period() -> None:
    state = FabricState(policy=POLICY)
    verdict = {"mlx5_0/1": (C.SITE, "SM: port in INIT")}
    state, first = observe(state, [ib()], 0, verdict)
    assert [_short(r) for r in first] == [fault(C.SITE)]
    state, again = observe(state, [ib()], 5, verdict)
    assert again == ()
    state, quiet = observe(state, [ib()], 6, {})
    assert quiet == ()
    assert faulted(state) == {"mlx5_0/1": (C.SITE, "SM: port in INIT")}
    state, done = observe(state, [ib()], 16, {})
    assert [_short(r) for r in done] == [cleared(C.SITE)]
    assert faulted(state) == {}


def test_a_site_verdict_for_a_link_not_sampled_is_reported_and_cleared() -> None:
    state = FabricState(policy=POLICY)
    state, first = observe(state, [], 0, {"spine-uplink": (C.LINK_DOWN, "ibdiagnet")})
    assert [_short(r) for r in first] == [fault(C.LINK_DOWN, "spine-uplink")]
    state, _ = observe(state, [], 1, {})
    state, done = observe(state, [], 11, {})
    assert [_short(r) for r in done] == [cleared(C.LINK_DOWN, "spine-uplink")]
