"""The monitor's node state machine: tables of observation scripts, and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.health.catalog import classify
from services.health.monitor_core import (
    AnyObservation,
    CheckFailed,
    CheckPassed,
    Cleaned,
    ClusterHealth,
    FaultSeen,
    Guard,
    HealthPolicy,
    Heartbeat,
    Idle,
    NodeState,
    OperatorDrain,
    OperatorResume,
    Recovery,
    Tick,
    Transition,
    TransitionKind,
    WorkersFound,
    healthy_gpus,
    in_service,
    step,
)

UP, SUSPECT, CLEANING, DRAINING, DRAINED, DOWN, FAILED = (
    NodeState.UP,
    NodeState.SUSPECT,
    NodeState.CLEANING,
    NodeState.DRAINING,
    NodeState.DRAINED,
    NodeState.DOWN,
    NodeState.FAILED,
)
K = TransitionKind


def hb(running: int | None = 1, boot: str = "b1") -> Heartbeat:
    return Heartbeat(node="n1", boot_id=boot, running=running, gpu_count=4)


def xid(x: int, gpu: int | None = 0, action: int | None = None) -> FaultSeen:
    return FaultSeen(node="n1", gpu=gpu, classification=classify(x, action))


def check(boot: str = "b1", pending: tuple[int, ...] = ()) -> CheckPassed:
    return CheckPassed(node="n1", boot_id=boot, reset_pending=pending)


def found(workers: int, boot: str = "b1") -> WorkersFound:
    return WorkersFound(node="n1", boot_id=boot, workers=workers)


def cleaned(boot: str = "b1") -> Cleaned:
    return Cleaned(node="n1", boot_id=boot)


DRAIN = OperatorDrain(node="n1", by="ops", reason="bios update")
RESUME = OperatorResume(node="n1", by="ops", reason="fixed")

Script = list[tuple[float, AnyObservation]]
# name -> (script, policy, want final state, want (kind, from, to) of the LAST step)
Case = tuple[Script, HealthPolicy, NodeState, list[tuple[TransitionKind, NodeState, NodeState]]]
P = HealthPolicy()

CASES: dict[str, Case] = {
    "a first heartbeat registers the node UP, quietly": ([(0, hb())], P, UP, []),
    "silence past the heartbeat timeout makes the node SUSPECT, not DOWN": (
        [(0, hb()), (10.5, Tick())],
        P,
        SUSPECT,
        [(K.NODE_SUSPECT, UP, SUSPECT)],
    ),
    "silence within the timeout is fine": ([(0, hb()), (9.9, Tick())], P, UP, []),
    "a suspect node stays suspect, quietly, until down_after_s": (
        [(0, hb()), (10.5, Tick()), (19.9, Tick())],
        P,
        SUSPECT,
        [],
    ),
    "a suspect node silent past down_after_s is DOWN": (
        [(0, hb()), (10.5, Tick()), (20.5, Tick())],
        P,
        DOWN,
        [(K.NODE_DOWN, SUSPECT, DOWN)],
    ),
    "a suspect node that heartbeats again is UP, with no fault": (
        [(0, hb()), (10.5, Tick()), (15, hb())],
        P,
        UP,
        [(K.NODE_RECOVERED, SUSPECT, UP)],
    ),
    "a draining node that falls silent and speaks again is draining again": (
        [(0, hb()), (1, xid(119)), (12, Tick()), (13, hb())],
        P,
        DRAINING,
        [(K.NODE_DRAINING, SUSPECT, DRAINING)],
    ),
    "a suspect node back from a new boot waits for its registration's check": (
        [(0, hb()), (11, Tick()), (12, hb(boot="b2"))],
        P,
        SUSPECT,
        [],
    ),
    "a suspect node back from a new boot returns by its check": (
        [(0, hb()), (11, Tick()), (12, hb(boot="b2")), (12, check("b2"))],
        P,
        UP,
        [(K.NODE_RECOVERED, SUSPECT, UP)],
    ),
    "both deadlines are configurable": (
        [(0, hb()), (2.5, Tick()), (4.5, Tick())],
        HealthPolicy(heartbeat_timeout_s=2.0, down_after_s=4.0),
        DOWN,
        [(K.NODE_DOWN, SUSPECT, DOWN)],
    ),
    "a node silent past both deadlines at one tick goes straight DOWN": (
        [(0, hb()), (21, Tick())],
        P,
        DOWN,
        [(K.NODE_DOWN, UP, DOWN)],
    ),
    "no node is judged while the monitor's own bus is down": (
        [(0, hb()), (30, Tick(connected_since=None))],
        P,
        UP,
        [],
    ),
    "silence during our own outage is not the node's: judged from the reconnect": (
        [(0, hb()), (30, Tick(connected_since=25))],
        P,
        UP,
        [],
    ),
    "after a reconnect a silent node is SUSPECT, and not DOWN within the grace": (
        [(0, hb()), (36, Tick(connected_since=25)), (44.9, Tick(connected_since=25))],
        P,
        SUSPECT,
        [],
    ),
    "after the grace a node still silent is DOWN": (
        [(0, hb()), (36, Tick(connected_since=25)), (45.5, Tick(connected_since=25))],
        P,
        DOWN,
        [(K.NODE_DOWN, SUSPECT, DOWN)],
    ),
    "a DOWN node that heartbeats again from the same boot comes back": (
        [(0, hb()), (21, Tick()), (22, hb())],
        P,
        UP,
        [(K.NODE_RECOVERED, DOWN, UP)],
    ),
    "a DOWN node that owes a GPU reset drains when it speaks again, so the reset comes": (
        [(0, hb(running=0)), (1, xid(119)), (30, Tick()), (31, hb(running=0))],
        P,
        DRAINED,
        [(K.NODE_DRAINED, DOWN, DRAINED)],
    ),
    "a DOWN node back from a new boot waits for a health check": (
        [(0, hb()), (21, Tick()), (22, hb(boot="b2"))],
        P,
        DOWN,
        [],
    ),
    "heartbeats from a new boot do not return a DOWN node without its check": (
        [(0, hb()), (21, Tick()), (22, hb(boot="b2")), (23, hb(boot="b2"))],
        P,
        DOWN,
        [],
    ),
    "nor a SUSPECT one": (
        [(0, hb()), (11, Tick()), (12, hb(boot="b2")), (13, hb(boot="b2"))],
        P,
        SUSPECT,
        [],
    ),
    "a failed check from the new boot keeps the node out, owing a reset": (
        [
            (0, hb()),
            (21, Tick()),
            (22, hb(boot="b2")),
            (22, CheckFailed(node="n1", boot_id="b2", unhealthy_gpus=(1,))),
            (23, hb(boot="b2", running=0)),
        ],
        P,
        DRAINED,
        [(K.NODE_DRAINED, DOWN, DRAINED)],
    ),
    "a health check returns a node that came back from a new boot": (
        [(0, hb()), (21, Tick()), (22, hb(boot="b2")), (23, check("b2"))],
        P,
        UP,
        [(K.NODE_RECOVERED, DOWN, UP)],
    ),
    "a node that re-registers with workers running is CLEANING": (
        [(0, hb()), (5, found(2)), (5, hb()), (5, check())],
        P,
        CLEANING,
        [],
    ),
    "re-registering with workers takes an UP node out at once": (
        [(0, hb()), (5, found(2))],
        P,
        CLEANING,
        [(K.NODE_CLEANING, UP, CLEANING)],
    ),
    "node.cleaned for its boot returns a cleaning node to UP": (
        [(0, hb()), (5, found(2)), (5, hb()), (5, check()), (6, cleaned())],
        P,
        UP,
        [(K.NODE_RECOVERED, CLEANING, UP)],
    ),
    "node.cleaned for an older boot changes nothing": (
        [(0, hb()), (5, found(2)), (6, cleaned("b0"))],
        P,
        CLEANING,
        [],
    ),
    "a registration without workers is UP at once": (
        [(0, found(0)), (0, hb()), (0, check())],
        P,
        UP,
        [],
    ),
    "a new boot that registers with no workers ends the wait": (
        [(0, hb()), (5, found(2)), (9, found(0, "b2"))],
        P,
        UP,
        [(K.NODE_RECOVERED, CLEANING, UP)],
    ),
    "a rebooted node that registers with workers waits for the launcher after its check": (
        [(0, hb()), (1, xid(79)), (40, found(1, "b2")), (40, hb(boot="b2")), (40, check("b2"))],
        P,
        CLEANING,
        [(K.NODE_CLEANING, FAILED, CLEANING)],
    ),
    "a cleaning node that falls silent and speaks again is still cleaning": (
        [(0, hb()), (1, found(1)), (12, Tick()), (13, hb())],
        P,
        CLEANING,
        [(K.NODE_CLEANING, SUSPECT, CLEANING)],
    ),
    "an operator resume does not skip the launcher's cleaning": (
        [(0, hb()), (1, found(1)), (2, RESUME)],
        P,
        CLEANING,
        [],
    ),
    "a failed check while cleaning drains the node": (
        [(0, hb()), (1, found(1)), (1, CheckFailed(node="n1", unhealthy_gpus=(0,)))],
        P,
        DRAINING,
        [(K.NODE_FAULT, CLEANING, DRAINING)],
    ),
    "a cleaned node that still owes a reset drains instead of returning": (
        [
            (0, hb()),
            (1, found(1)),
            (1, CheckFailed(node="n1", unhealthy_gpus=(0,))),
            (2, cleaned()),
        ],
        P,
        DRAINING,
        [],
    ),
    "an application xid tells the job but leaves the node UP": (
        [(0, hb()), (1, xid(13))],
        P,
        UP,
        [(K.NODE_FAULT, UP, UP)],
    ),
    "a GPU-reset xid drains a busy node": (
        [(0, hb()), (1, xid(119))],
        P,
        DRAINING,
        [(K.NODE_FAULT, UP, DRAINING)],
    ),
    "a GPU-reset xid on an idle node leaves it DRAINED": (
        [(0, hb(running=0)), (1, xid(62))],
        P,
        DRAINED,
        [(K.NODE_FAULT, UP, DRAINED)],
    ),
    "a draining node that goes idle is DRAINED": (
        [(0, hb()), (1, xid(119)), (2, Idle(node="n1"))],
        P,
        DRAINED,
        [(K.NODE_DRAINED, DRAINING, DRAINED)],
    ),
    "a heartbeat with no running jobs also finishes the drain": (
        [(0, hb()), (1, xid(74)), (2, hb(running=0))],
        P,
        DRAINED,
        [(K.NODE_DRAINED, DRAINING, DRAINED)],
    ),
    "a passing check after the GPU reset brings the node back": (
        [(0, hb()), (1, xid(119)), (2, Idle(node="n1")), (3, check())],
        P,
        UP,
        [(K.NODE_RECOVERED, DRAINED, UP)],
    ),
    "xid 79 fails the node for a reboot": (
        [(0, hb()), (1, xid(79))],
        P,
        FAILED,
        [(K.NODE_FAULT, UP, FAILED)],
    ),
    "a check from the boot that needed rebooting changes nothing": (
        [(0, hb()), (1, xid(79)), (2, check("b1"))],
        P,
        FAILED,
        [],
    ),
    "a check from a new boot brings a rebooted node back": (
        [(0, hb()), (1, xid(79)), (40, hb(boot="b2")), (41, check("b2"))],
        P,
        UP,
        [(K.NODE_RECOVERED, FAILED, UP)],
    ),
    "a rebooting node that goes silent is DOWN, then back by its check": (
        [(0, hb()), (1, xid(79)), (30, Tick()), (60, hb(boot="b2")), (61, check("b2"))],
        P,
        UP,
        [(K.NODE_RECOVERED, DOWN, UP)],
    ),
    "a reboot fault on a draining node escalates to FAILED": (
        [(0, hb()), (1, xid(119)), (2, xid(79, gpu=1))],
        P,
        FAILED,
        [(K.NODE_FAULT, DRAINING, FAILED)],
    ),
    "an informational xid changes nothing": ([(0, hb()), (1, xid(92))], P, UP, []),
    "a pending row remap keeps the node UP and tells the probe": (
        [(0, hb()), (1, xid(63))],
        P,
        UP,
        [(K.NODE_FAULT, UP, UP)],
    ),
    "the driver's drain-and-reset keeps the node UP without that GPU": (
        [(0, hb()), (1, xid(94, gpu=2, action=4))],
        P,
        UP,
        [(K.NODE_FAULT, UP, UP)],
    ),
    "the third failure within the window holds the node": (
        [
            (0, hb(running=0)),
            (1, xid(119)),
            (2, check()),
            (3, xid(119)),
            (4, check()),
            (5, xid(119)),
        ],
        P,
        FAILED,
        [(K.NODE_FAULT, UP, DRAINED), (K.NODE_HELD, DRAINED, FAILED)],
    ),
    "a held node ignores passing checks": (
        [
            (0, hb(running=0)),
            (1, xid(119)),
            (2, check()),
            (3, xid(119)),
            (4, check()),
            (5, xid(119)),
            (6, check()),
        ],
        P,
        FAILED,
        [],
    ),
    "failures spread wider than the window do not hold": (
        [
            (0, hb(running=0)),
            (1, xid(119)),
            (2, check()),
            (3, xid(119)),
            (4, check()),
            (5000, xid(119)),
        ],
        P,
        DRAINED,
        [(K.NODE_FAULT, UP, DRAINED)],
    ),
    "an operator resume releases a held node": (
        [
            (0, hb(running=0)),
            (1, xid(119)),
            (2, check()),
            (3, xid(119)),
            (4, check()),
            (5, xid(119)),
            (6, RESUME),
        ],
        P,
        UP,
        [(K.NODE_RECOVERED, FAILED, UP)],
    ),
    "an operator drain of a busy node is DRAINING": (
        [(0, hb()), (1, DRAIN)],
        P,
        DRAINING,
        [(K.NODE_DRAINING, UP, DRAINING)],
    ),
    "an operator drain of an idle node is DRAINED at once": (
        [(0, hb(running=0)), (1, DRAIN)],
        P,
        DRAINED,
        [(K.NODE_DRAINED, UP, DRAINED)],
    ),
    "an operator-drained node ignores passing checks": (
        [(0, hb(running=0)), (1, DRAIN), (2, check())],
        P,
        DRAINED,
        [],
    ),
    "an operator resume returns a drained node": (
        [(0, hb(running=0)), (1, DRAIN), (2, RESUME)],
        P,
        UP,
        [(K.NODE_RECOVERED, DRAINED, UP)],
    ),
    "a node drained by an operator stays drained after a fault is healed": (
        [(0, hb(running=0)), (1, DRAIN), (2, xid(119)), (3, check())],
        P,
        DRAINED,
        [],
    ),
    "an operator resume of a DOWN node keeps it DOWN until it heartbeats": (
        [(0, hb()), (21, Tick()), (22, RESUME)],
        P,
        DOWN,
        [],
    ),
    "an operator resume of a DOWN node that heartbeats again returns it": (
        [(0, hb()), (21, Tick()), (22, hb(boot="b2")), (23, RESUME)],
        P,
        UP,
        [(K.NODE_RECOVERED, DOWN, UP)],
    ),
    "a held node back from a new boot passes its check but stays FAILED": (
        [
            (0, hb(running=0)),
            (1, xid(119)),
            (2, check()),
            (3, xid(119)),
            (4, check()),
            (5, hb()),
            (26, Tick()),
            (27, hb(boot="b2")),
            (28, check("b2")),
        ],
        P,
        FAILED,
        [(K.NODE_HELD, DOWN, FAILED)],
    ),
    "a check from the boot that needed rebooting leaves its GPU unhealthy": (
        [(0, hb()), (1, xid(79, gpu=2)), (2, check("b1"))],
        P,
        FAILED,
        [],
    ),
    "a failed check takes an UP node out": (
        [
            (0, hb()),
            (
                1,
                CheckFailed(
                    node="n1", problems=("GPU 1: row remapping failed",), unhealthy_gpus=(1,)
                ),
            ),
        ],
        P,
        DRAINING,
        [(K.NODE_FAULT, UP, DRAINING)],
    ),
    "without auto-return a check clears the fault but only the operator returns it": (
        [(0, hb(running=0)), (1, xid(119)), (2, check())],
        HealthPolicy(auto_return=False),
        DRAINED,
        [],
    ),
}


def run(script: Script, policy: HealthPolicy) -> tuple[ClusterHealth, tuple[Transition, ...]]:
    state = ClusterHealth(policy=policy)
    out: tuple[Transition, ...] = ()
    for now, obs in script:
        state, out = step(state, obs, now)
    return state, out


@pytest.mark.parametrize(
    ("script", "policy", "want_state", "want_out"), CASES.values(), ids=CASES.keys()
)
def test_step(
    script: Script,
    policy: HealthPolicy,
    want_state: NodeState,
    want_out: list[tuple[TransitionKind, NodeState, NodeState]],
) -> None:
    state, out = run(script, policy)
    assert state.nodes["n1"].state is want_state
    assert [(t.kind, t.from_state, t.to_state) for t in out] == want_out


def test_a_fault_transition_carries_the_gpu_and_classification() -> None:
    _, out = run([(0, hb()), (1, xid(119, gpu=3))], P)
    [fault] = out
    assert (fault.node, fault.gpu, fault.classification) == ("n1", 3, classify(119))
    assert "xid 119 on gpu 3" in fault.reason


def test_gpu_health_follows_faults_and_checks() -> None:
    state, _ = run([(0, hb()), (1, xid(94, gpu=2, action=4)), (2, xid(63, gpu=1))], P)
    node = state.nodes["n1"]
    assert healthy_gpus(node) == (0, 1, 3)
    assert [g.reset_pending for g in node.gpus] == [False, True, True, False]
    assert [g.last_xid for g in node.gpus] == [None, 63, 94, None]
    state, _ = step(state, check(pending=(1,)), 3)
    assert healthy_gpus(state.nodes["n1"]) == (0, 1, 2, 3)
    assert [g.reset_pending for g in state.nodes["n1"].gpus] == [False, True, False, False]


def test_the_reason_says_who_drained_and_why() -> None:
    state, _ = run([(0, hb()), (1, DRAIN)], P)
    assert state.nodes["n1"].reason == "drained by ops: bios update"


def test_a_tick_checks_every_node_and_only_the_silent_go_down() -> None:
    state = ClusterHealth()
    state, _ = step(state, Heartbeat(node="a"), 0)
    state, _ = step(state, Heartbeat(node="b"), 18)
    state, out = step(state, Tick(), 21)
    assert [(t.node, t.kind) for t in out] == [("a", K.NODE_DOWN)]
    assert not in_service(state.nodes["a"]) and in_service(state.nodes["b"])


# -- the mass-outage guard: several nodes -----------------------------------------------

FOUR = ("a", "b", "c", "d")
# name -> (script over nodes a-d, want guard after the last tick, want every node's state)
GuardCase = tuple[list[tuple[float, AnyObservation]], Guard, dict[str, NodeState]]


def heard(at: float, *names: str) -> list[tuple[float, AnyObservation]]:
    return [(at, Heartbeat(node=n)) for n in names]


GUARD_CASES: dict[str, GuardCase] = {
    "one silent node of four is DOWN as usual": (
        [*heard(0, *FOUR), *heard(20, "b", "c", "d"), (21, Tick())],
        Guard.NONE,
        {"a": DOWN, "b": UP, "c": UP, "d": UP},
    ),
    "half the nodes silent at once: none is DOWN, the guard holds": (
        [*heard(0, *FOUR), *heard(20, "c", "d"), (21, Tick())],
        Guard.MASS_SILENCE,
        {"a": SUSPECT, "b": SUSPECT, "c": UP, "d": UP},
    ),
    "the guard holds however long the silence lasts": (
        [*heard(0, *FOUR), *heard(20, "c", "d"), (21, Tick()), *heard(99, "c", "d"), (100, Tick())],
        Guard.MASS_SILENCE,
        {"a": SUSPECT, "b": SUSPECT, "c": UP, "d": UP},
    ),
    "the guard releases when the silent nodes speak again, with no fault": (
        [*heard(0, *FOUR), *heard(20, "c", "d"), (21, Tick()), *heard(22, *FOUR), (23, Tick())],
        Guard.NONE,
        {"a": UP, "b": UP, "c": UP, "d": UP},
    ),
    "once only one node is still silent, it is DOWN": (
        [
            *heard(0, *FOUR),
            *heard(20, "c", "d"),
            (21, Tick()),
            *heard(22, "a", "c", "d"),
            (23, Tick()),
        ],
        Guard.NONE,
        {"a": UP, "b": DOWN, "c": UP, "d": UP},
    ),
    "one silent node of two is that node's fault, not an outage": (
        [*heard(0, "a", "b"), *heard(20, "b"), (21, Tick())],
        Guard.NONE,
        {"a": DOWN, "b": UP},
    ),
    "nodes already DOWN do not count toward the share": (
        [
            *heard(0, *FOUR),
            *heard(20, "b", "c", "d"),
            (21, Tick()),
            *heard(40, "c", "d"),
            (41, Tick()),
        ],
        Guard.NONE,
        {"a": DOWN, "b": DOWN, "c": UP, "d": UP},
    ),
    "while the monitor's bus is down every node keeps its state": (
        [*heard(0, *FOUR), (15, Tick()), (30, Tick(connected_since=None))],
        Guard.BUS_DOWN,
        {"a": SUSPECT, "b": SUSPECT, "c": SUSPECT, "d": SUSPECT},
    ),
    "just after a reconnect the grace holds and nobody is blamed yet": (
        [*heard(0, *FOUR), (30, Tick(connected_since=None)), (31, Tick(connected_since=30))],
        Guard.BUS_GRACE,
        {"a": UP, "b": UP, "c": UP, "d": UP},
    ),
    "the grace lasts down_after_s: a node dead all along is DOWN only after it": (
        [
            *heard(0, *FOUR),
            (30, Tick(connected_since=None)),
            *heard(31, "b", "c", "d"),
            (45, Tick(connected_since=30)),
            *heard(49, "b", "c", "d"),
            (49.9, Tick(connected_since=30)),
            *heard(50, "b", "c", "d"),
            (50.5, Tick(connected_since=30)),
        ],
        Guard.NONE,
        {"a": DOWN, "b": UP, "c": UP, "d": UP},
    ),
    "the share is configurable": (
        [*heard(0, *FOUR), *heard(20, "c", "d"), (21, Tick())],
        Guard.NONE,
        {"a": DOWN, "b": DOWN, "c": UP, "d": UP},
    ),
}
GUARD_POLICIES = {"the share is configurable": HealthPolicy(max_silent_share=0.75)}


@pytest.mark.parametrize(("name", "case"), GUARD_CASES.items(), ids=GUARD_CASES.keys())
def test_the_mass_outage_guard(name: str, case: GuardCase) -> None:
    script, want_guard, want_states = case
    state = ClusterHealth(policy=GUARD_POLICIES.get(name, P))
    for now, obs in script:
        state, _ = step(state, obs, now)
    assert state.guard is want_guard
    assert {n: node.state for n, node in state.nodes.items()} == want_states


def test_a_tick_under_the_guard_declares_nobody_down_and_says_so_once() -> None:
    state = ClusterHealth()
    for now, obs in [*heard(0, *FOUR), *heard(20, "c", "d")]:
        state, _ = step(state, obs, now)
    state, out = step(state, Tick(), 21)
    assert [(t.node, t.kind) for t in out] == [("a", K.NODE_SUSPECT), ("b", K.NODE_SUSPECT)]
    assert state.guard is Guard.MASS_SILENCE
    state, out = step(state, Tick(), 30)
    assert out == () and state.guard is Guard.MASS_SILENCE


def test_a_cleaning_node_says_what_it_waits_for_wherever_it_came_from() -> None:
    at_once: Script = [(0, hb()), (1, found(2))]
    after_silence: Script = [(0, hb()), (1, found(1)), (12, Tick()), (13, hb())]
    for script in (at_once, after_silence):
        state, _ = run(script, P)
        assert "waiting for the launcher" in state.nodes["n1"].reason


def test_step_never_mutates_its_input() -> None:
    before, _ = run([(0, hb())], P)
    snapshot = before.nodes["n1"]
    step(before, xid(79), 1)
    assert before.nodes["n1"] == snapshot and before.nodes["n1"].state is UP


# -- properties ------------------------------------------------------------------------

OBSERVATIONS = st.one_of(
    st.builds(
        Heartbeat,
        node=st.just("n1"),
        boot_id=st.sampled_from(["b1", "b2"]),
        running=st.sampled_from([None, 0, 1]),
    ),
    st.builds(
        FaultSeen,
        node=st.just("n1"),
        gpu=st.sampled_from([None, 0, 1]),
        classification=st.builds(
            classify,
            st.sampled_from([13, 48, 62, 63, 74, 79, 92, 94, 119, 154, 999]),
            st.sampled_from([None, 0, 1, 2, 4]),
        ),
    ),
    st.builds(CheckPassed, node=st.just("n1"), boot_id=st.sampled_from(["", "b1", "b2"])),
    st.builds(CheckFailed, node=st.just("n1"), unhealthy_gpus=st.just((0,))),
    st.builds(Idle, node=st.just("n1")),
    st.just(DRAIN),
    st.just(RESUME),
    st.builds(
        WorkersFound,
        node=st.just("n1"),
        boot_id=st.sampled_from(["b1", "b2"]),
        workers=st.sampled_from([0, 2]),
    ),
    st.builds(Cleaned, node=st.just("n1"), boot_id=st.sampled_from(["", "b1", "b2"])),
    st.builds(Tick, connected_since=st.sampled_from([None, 0.0, 40.0])),
)


@settings(max_examples=150)
@given(st.lists(st.tuples(st.floats(0, 30), OBSERVATIONS), max_size=25))
def test_any_sequence_keeps_the_state_machine_consistent(
    raw: list[tuple[float, AnyObservation]],
) -> None:
    state = ClusterHealth()
    now = 0.0
    for dt, obs in raw:
        now += dt
        prior = state.nodes.get("n1")
        state, out = step(state, obs, now)
        node = state.nodes.get("n1")
        for t in out:
            assert prior is None or t.from_state in (prior.state, out[0].to_state)
        if out:
            assert out[-1].to_state is (node.state if node else None)
        if node is not None and node.state is UP:
            # UP only when nothing is owed: not held, not drained by an operator, no reboot due
            assert not node.held and not node.operator_drain and node.recovery is Recovery.NONE
            assert not node.clean_boot_id  # nor stale workers the launcher has not stopped
        if isinstance(obs, Tick) and state.guard is not Guard.NONE:
            assert K.NODE_DOWN not in {t.kind for t in out}


def test_a_check_from_the_faulty_boot_keeps_the_gpu_out() -> None:
    state, _ = run([(0, hb()), (1, xid(79, gpu=2)), (2, check("b1"))], P)
    assert healthy_gpus(state.nodes["n1"]) == (0, 1, 3)
    state, _ = step(state, check("b2"), 3)
    assert healthy_gpus(state.nodes["n1"]) == (0, 1, 2, 3)


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 8),
            st.one_of(
                st.builds(Heartbeat, node=st.sampled_from(FOUR)),
                st.builds(Tick, connected_since=st.sampled_from([None, 0.0, 30.0, 60.0])),
            ),
        ),
        max_size=40,
    )
)
def test_no_node_is_declared_down_while_many_are_silent_or_the_bus_is_not_long_back(
    raw: list[tuple[float, AnyObservation]],
) -> None:
    state = ClusterHealth()
    for name in FOUR:
        state, _ = step(state, Heartbeat(node=name), 0.0)
    now = 0.0
    for dt, obs in raw:
        now += dt
        prior = state
        state, out = step(state, obs, now)
        if not isinstance(obs, Tick) or K.NODE_DOWN not in {t.kind for t in out}:
            continue
        # DOWN only long after our own reconnect, and only with few nodes silent.
        assert obs.connected_since is not None
        assert now - obs.connected_since >= P.down_after_s
        live = [n for n in prior.nodes.values() if n.state is not DOWN]
        silent = [
            n
            for n in live
            if now - max(n.last_heartbeat or 0.0, obs.connected_since) > P.heartbeat_timeout_s
        ]
        assert len(silent) < 2 or len(silent) < P.max_silent_share * len(live)
