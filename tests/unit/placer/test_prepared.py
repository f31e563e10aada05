"""The incremental path: a prepared cluster places one more job without a full pass."""

from __future__ import annotations

from services.placer.core import Fit, Grant, Plan, Start, Wait, Waiting, place, prepare
from tests.unit.placer.helpers import T0, gang, leafy, running, snapshot, whole


def test_place_one_sees_the_starts_and_bookings_of_the_pass_before() -> None:
    snap = snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00")),))
    prep = prepare(snap, T0)
    first = prep.plan(
        [
            gang(1, nodes=4, gpus_per_node=8, priority=5.0),
            gang(2, gpus_per_node=8, time_limit_s=7200),
        ]
    )
    assert [w.reason for w in first.waits] == [Waiting.RESOURCES, Waiting.PRIORITY]
    # job 3 is short enough to run before job 1's booked start; job 4 is not
    short = prep.place_one(gang(3, gpus_per_node=8, time_limit_s=600))
    assert [s.job_id for s in short.starts] == [3]
    long = prep.place_one(gang(4, gpus_per_node=8, time_limit_s=86_400))
    want = Wait(job_id=4, reason=Waiting.PRIORITY, detail="behind job 1", estimated_start=T0 + 7200)
    assert long == Plan(waits=(want,))


def test_place_one_on_a_fresh_cluster_matches_a_full_pass() -> None:
    snap = snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00")),))
    job = gang(1, nodes=2, gpus_per_node=8)
    assert prepare(snap, T0).place_one(job) == place(snap, [job], now=T0)
    assert place(snap, [job], now=T0).starts == (
        Start(
            job_id=1,
            grants=(
                Grant(node="n02", gpus=tuple(range(8))),
                Grant(node="n03", gpus=tuple(range(8))),
            ),
            fit=Fit.SWITCH,
            domain="leaf1",
        ),
    )
