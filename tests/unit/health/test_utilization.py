"""The GPU-time tally (services/health/utilization.py): what each GPU's time counts as,
by its node's state, its health and whether an allocation holds it; how much time one
liveness pass counts; and the hour it goes to."""

from __future__ import annotations

import pytest

from services.health.monitor_model import GpuHealth, NodeHealth
from services.health.utilization import (
    MAX_TALLY_S,
    counted_s,
    gpu_time,
    hour_of,
    hours_of,
    tally,
)
from shared.states import GpuTime, NodeState

T = GpuTime
STATES = {
    # (node state, operator drain, GPU healthy, allocated) -> counted as
    "held by a job: allocated, whatever else": (NodeState.DOWN, False, False, True, T.ALLOCATED),
    "held on an UP node": (NodeState.UP, False, True, True, T.ALLOCATED),
    "healthy and free on an UP node: idle": (NodeState.UP, False, True, False, T.IDLE),
    "an unhealthy GPU on an UP node: down": (NodeState.UP, False, False, False, T.DOWN),
    "an operator's drain: planned down": (NodeState.DRAINED, True, True, False, T.PLANNED_DOWN),
    "so while it drains": (NodeState.DRAINING, True, True, False, T.PLANNED_DOWN),
    "a drain for a fault (a reset owed): down": (NodeState.DRAINED, False, True, False, T.DOWN),
    "an unhealthy GPU on a drained node: down": (NodeState.DRAINED, True, False, False, T.DOWN),
    "a node down: down": (NodeState.DOWN, False, True, False, T.DOWN),
    "failed: down": (NodeState.FAILED, False, True, False, T.DOWN),
    "silent: down": (NodeState.SUSPECT, False, True, False, T.DOWN),
    "cleaning stale workers: down": (NodeState.CLEANING, False, True, False, T.DOWN),
}  # fmt: skip


@pytest.mark.parametrize(
    ("state", "drain", "healthy", "allocated", "counted"), STATES.values(), ids=STATES.keys()
)
def test_what_a_gpus_time_counts_as(
    state: NodeState, drain: bool, healthy: bool, allocated: bool, counted: GpuTime
) -> None:
    node = NodeHealth(name="n1", state=state, operator_drain=drain)
    assert gpu_time(node, healthy, allocated) is counted


def test_a_pass_counts_every_gpu_once_in_its_state() -> None:
    gpus = tuple(GpuHealth(index=i, healthy=i != 3) for i in range(4))
    nodes = [
        NodeHealth(name="n1", gpus=gpus),  # 0, 1 held; 2 idle; 3 unhealthy
        NodeHealth(name="n2", state=NodeState.DRAINED, operator_drain=True, gpus=gpus[:2]),
        NodeHealth(name="n3", state=NodeState.DOWN, gpus=gpus[:1]),
    ]
    got = tally(nodes, {"n1": frozenset({0, 1}), "gone": frozenset({0})}, 2.0)
    assert got == {T.ALLOCATED: 4.0, T.IDLE: 2.0, T.DOWN: 4.0, T.PLANNED_DOWN: 4.0}
    assert tally([], {}, 2.0) == {}


@pytest.mark.parametrize(
    ("now", "last", "seconds"),
    [
        (100.0, None, 0.0),  # a holder's first pass: nothing known before it
        (100.0, 99.0, 1.0),
        (100.0, 100.0, 0.0),
        (100.0, 101.0, 0.0),  # the clock went back: nothing
        (100.0, 50.0, MAX_TALLY_S),  # a gap (paused, PostgreSQL away): only that much
    ],
)
def test_a_pass_counts_the_time_since_the_last_at_most_a_bound(
    now: float, last: float | None, seconds: float
) -> None:
    assert counted_s(now, last) == seconds


def test_a_pass_counts_into_the_hour_it_ran_in() -> None:
    assert hour_of(7200.0) == 7200.0
    assert hour_of(10799.5) == 7200.0


@pytest.mark.parametrize(
    ("now", "seconds", "parts"),
    [
        (7205.0, 1.0, [(7200.0, 1.0)]),  # inside an hour
        (7203.0, 5.0, [(3600.0, 2.0), (7200.0, 3.0)]),  # across its start: shared
        (7200.0, 4.0, [(3600.0, 4.0)]),  # ending on the start: all the hour before
        (7204.0, 4.0, [(7200.0, 4.0)]),  # starting on it: all the hour after
        (7205.0, 0.0, []),
    ],
)
def test_a_pass_that_crosses_an_hours_start_gives_each_hour_its_share(
    now: float, seconds: float, parts: list[tuple[float, float]]
) -> None:
    assert hours_of(now, seconds) == parts
    assert sum(part for _, part in parts) == seconds
