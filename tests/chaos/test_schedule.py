"""Table tests of the pure fault schedule: a seed names one schedule, for ever."""

from __future__ import annotations

import itertools

import pytest

from tests.chaos.schedule import GAP_S, Fault, Kind, Targets, counts, schedule

TARGETS = Targets(services=("admission", "placer"), nodes=("node01", "node02"), gpus_per_node=2)

CASES = {
    "a seed draws the same three faults every time (golden)": (
        (7, (Kind.KILL_SERVICE, Kind.PARTITION, Kind.XID_APP), 3, 30.0),
        [
            Fault(at=0.91, kind=Kind.PARTITION, target="node01", hold_s=6.69),
            Fault(at=10.69, kind=Kind.KILL_SERVICE, target="admission", hold_s=1.68),
            Fault(at=20.77, kind=Kind.XID_APP, target="node01", hold_s=0.0, gpu=1),
        ],
    ),
    "PostgreSQL has one target, named by nothing": (
        (7, (Kind.KILL_POSTGRES,), 1, 5.0),
        [Fault(at=0.07, kind=Kind.KILL_POSTGRES, target="", hold_s=3.82)],
    ),
    "no faults asked, none drawn": ((7, (Kind.KILL_AGENT,), 0, 30.0), []),
    "no kinds allowed, none drawn": ((7, (), 5, 30.0), []),
}


@pytest.mark.parametrize(("args", "want"), CASES.values(), ids=CASES.keys())
def test_schedule(args: tuple[int, tuple[Kind, ...], int, float], want: list[Fault]) -> None:
    assert schedule(*args, TARGETS) == want


@pytest.mark.parametrize("seed", range(20))
def test_every_fault_is_undone_before_the_next_begins_and_fits_the_run(seed: int) -> None:
    faults = schedule(seed, tuple(Kind), 40, 120.0, TARGETS)
    assert len(faults) == 40
    for before, after in itertools.pairwise(faults):
        assert before.at + before.hold_s + GAP_S <= after.at + 1e-6
    assert faults[-1].at + faults[-1].hold_s <= 120.0


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    one = schedule(11, tuple(Kind), 30, 90.0, TARGETS)
    assert one == schedule(11, tuple(Kind), 30, 90.0, TARGETS)
    assert one != schedule(12, tuple(Kind), 30, 90.0, TARGETS)


def test_only_the_kinds_asked_for_are_drawn_and_every_kind_is_counted() -> None:
    faults = schedule(3, (Kind.KILL_AGENT, Kind.PAUSE_AGENT), 10, 60.0, TARGETS)
    got = counts(faults)
    assert got[Kind.KILL_AGENT] + got[Kind.PAUSE_AGENT] == 10
    assert sum(got.values()) == 10
    assert set(got) == {k.value for k in Kind}
    assert {f.target for f in faults} <= set(TARGETS.nodes)
