"""Table tests of the placer's policies: backfill, switches, preemption, windows, limits."""

from __future__ import annotations

import pytest

from services.placer.core import (
    Backfill,
    Fit,
    Grant,
    Limit,
    Limits,
    Plan,
    PolicyConfig,
    Preempt,
    QosLimit,
    Recurrence,
    Reservation,
    Snapshot,
    Start,
    Wait,
    Waiting,
    place,
)
from services.placer.core.model import JobRequest
from tests.unit.placer.helpers import T0, gang, grant, leafy, node, running, snapshot, whole

H = 3600.0
ALL8 = tuple(range(8))
NODES32 = tuple(node(f"n{i:02d}") for i in range(32))
JOB1_ON_N00 = (running(1, whole("n00"), started_at=T0 - H, time_limit_s=7200),)


def on(job_id: int, names: list[str], gpus: tuple[int, ...] = ALL8) -> tuple[Grant, ...]:
    del job_id
    return tuple(Grant(node=n, gpus=gpus) for n in names)


def backfill_case(limit_s: int) -> tuple[Snapshot, list[JobRequest]]:
    """Slurm's classic: job1 runs on 1 of 32 nodes; job2 wants all 32; job3 wants 31."""
    return (
        snapshot(*NODES32, running=JOB1_ON_N00),
        [gang(2, nodes=32, gpus_per_node=8, priority=10), gang(3, 31, 8, time_limit_s=limit_s)],
    )


CASES: dict[str, tuple[Snapshot, list[JobRequest], Plan]] = {
    "a short 31-node job is backfilled before the 32-node job's reserved start": (
        *backfill_case(1800),
        Plan(
            starts=(
                Start(
                    job_id=3,
                    grants=on(3, [f"n{i:02d}" for i in range(1, 32)]),
                    backfilled=True,
                    fit=Fit.FLAT,
                    backfill=Backfill.BEFORE_RESERVED_START,
                    around=2,
                ),
            ),
            waits=(Wait(job_id=2, reason=Waiting.RESOURCES, estimated_start=T0 + H),),
        ),
    ),
    "a long 31-node job is not backfilled: it would delay the 32-node job": (
        *backfill_case(7200),
        Plan(
            waits=(
                Wait(job_id=2, reason=Waiting.RESOURCES, estimated_start=T0 + H),
                Wait(
                    job_id=3,
                    reason=Waiting.PRIORITY,
                    detail="behind job 2",
                    estimated_start=T0 + 2 * H,
                ),
            )
        ),
    ),
    "a gang under --switches=1 waits for one leaf while two leaves are free": (
        snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00"), whole("n02")),)),
        [gang(1, nodes=2, gpus_per_node=8, max_switches=1, switches_wait_s=1800)],
        Plan(
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.TOPOLOGY,
                    detail="not within 1 leaf switches yet",
                    estimated_start=T0 - 999 + 1800,
                ),
            )
        ),
    ),
    "a gang under --switches=1@T spreads once T has passed": (
        snapshot(*leafy(4, per_leaf=2), running=(running(9, whole("n00"), whole("n02")),)),
        [gang(1, nodes=2, gpus_per_node=8, max_switches=1, switches_wait_s=60)],
        Plan(
            starts=(
                Start(
                    job_id=1,
                    grants=on(1, ["n01", "n03"]),
                    fit=Fit.ACROSS_SWITCHES,
                ),
            )
        ),
    ),
    "a higher tier preempts the cheapest lower-tier job and waits for it": (
        snapshot(
            node("a"),
            running=(
                running(7, grant("a", 0, 1, 2, 3), priority=5.0, grace_s=30),
                running(8, grant("a", 4, 5, 6, 7), priority=1.0, grace_s=60),
            ),
        ),
        [gang(1, gpus_per_node=4, tier=1, can_preempt=True)],
        Plan(
            preemptions=(Preempt(victim_job_id=8, for_job_id=1, grace_s=60),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.PREEMPTING,
                    detail="waiting for 8 to exit",
                    estimated_start=T0 + 60,
                ),
            ),
        ),
    ),
    "non-preemptible, too-young and equal-tier jobs are never victims": (
        snapshot(
            node("a", 3),
            running=(
                running(7, grant("a", 0), preemptible=False),
                running(8, grant("a", 1), min_runtime_s=7200),
                running(9, grant("a", 2), tier=1),
            ),
        ),
        [gang(1, gpus_per_node=1, tier=1, can_preempt=True)],
        Plan(waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + H),)),
    ),
    "preemption takes only what the preemptor needs, least progress first": (
        snapshot(
            node("a"),
            node("b"),
            running=(
                running(7, whole("a"), started_at=T0 - 600),
                running(8, whole("b"), started_at=T0 - 60),
            ),
        ),
        [gang(1, gpus_per_node=8, tier=2, can_preempt=True)],
        Plan(
            preemptions=(Preempt(victim_job_id=8, for_job_id=1, grace_s=0),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.PREEMPTING,
                    detail="waiting for 8 to exit",
                    estimated_start=T0,
                ),
            ),
        ),
    ),
    "a job that would run into maintenance waits; a short one runs before it": (
        snapshot(
            node("a"),
            reservations=(
                Reservation(name="maint", start=T0 + H, duration_s=7200, maintenance=True),
            ),
        ),
        [gang(1, gpus_per_node=4, time_limit_s=7200), gang(2, gpus_per_node=4, time_limit_s=600)],
        Plan(
            starts=(Start(job_id=2, grants=(Grant(node="a", gpus=(0, 1, 2, 3)),), fit=Fit.NODE),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.RESERVATION,
                    detail=f"would run into maint at {T0 + H:.0f}",
                    estimated_start=T0 + 3 * H,
                ),
            ),
        ),
    ),
    "a daily window recurs; its accounts may run inside, others keep off": (
        snapshot(
            node("a"),
            node("b"),
            reservations=(
                Reservation(
                    name="daily",
                    start=T0 - 10 * 86_400 - 600,
                    duration_s=3600,
                    nodes=("b",),
                    accounts=("vip",),
                    recurrence=Recurrence.DAILY,
                ),
            ),
        ),
        [
            gang(1, gpus_per_node=8, account="vip"),
            gang(2, gpus_per_node=8),
            gang(3, gpus_per_node=8),
        ],
        Plan(
            starts=(
                Start(
                    job_id=1,
                    grants=on(1, ["a"]),
                    fit=Fit.NODE,
                ),
            ),
            waits=(
                Wait(
                    job_id=2,
                    reason=Waiting.RESERVATION,
                    detail=f"would run into daily at {T0 - 600:.0f}",
                    estimated_start=T0 + 3000,
                ),
                Wait(
                    job_id=3,
                    reason=Waiting.RESERVATION,
                    detail=f"would run into daily at {T0 - 600:.0f}",
                    estimated_start=T0 + 3000,
                ),
            ),
        ),
    ),
    "limits per user, account and QOS hold jobs back with a named reason": (
        snapshot(
            node("a"),
            running=(running(9, grant("a", 0), user="alice", account="ml"),),
            limits=Limits(
                users={"alice": Limit(max_gpus=2)},
                accounts={"ml": Limit(max_jobs=1)},
                qos={"low": QosLimit(max_gpus_per_user=1)},
            ),
        ),
        [
            gang(1, gpus_per_node=2, user="alice"),
            gang(2, gpus_per_node=1, user="carol", account="ml"),
            gang(3, gpus_per_node=2, user="dave", qos="low"),
            gang(4, gpus_per_node=1, user="alice"),
        ],
        Plan(
            starts=(Start(job_id=4, grants=(Grant(node="a", gpus=(1,)),), fit=Fit.NODE),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.USER_MAX_GPUS,
                    detail="1 GPUs running + 2 asked > 2",
                ),
                Wait(
                    job_id=2,
                    reason=Waiting.ACCOUNT_MAX_JOBS,
                    detail="1 jobs running, cap 1",
                ),
                Wait(
                    job_id=3,
                    reason=Waiting.QOS_MAX_GPUS_PER_USER,
                    detail="0 GPUs running + 2 asked > 1",
                ),
            ),
        ),
    ),
    "a requeued job goes to the head of its priority, ahead of older jobs": (
        snapshot(node("a", 4)),
        [
            gang(1, gpus_per_node=4, user="carol"),
            gang(2, gpus_per_node=4, user="dave", requeued=True),
        ],
        Plan(
            starts=(Start(job_id=2, grants=(Grant(node="a", gpus=(0, 1, 2, 3)),), fit=Fit.NODE),),
            waits=(Wait(job_id=1, reason=Waiting.RESOURCES, estimated_start=T0 + 3600),),
        ),
    ),
    "a QOS caps each account's GPUs: a second account's job still starts": (
        snapshot(
            node("a", 4),
            running=(running(9, grant("a", 0, 1), user="bob", account="ml", qos="normal"),),
            limits=Limits(qos={"normal": QosLimit(max_gpus_per_account=2)}),
        ),
        [
            gang(1, gpus_per_node=1, user="carol", account="ml", qos="normal"),
            gang(2, gpus_per_node=1, user="dave", account="prod", qos="normal"),
        ],
        Plan(
            starts=(Start(job_id=2, grants=(Grant(node="a", gpus=(2,)),), fit=Fit.NODE),),
            waits=(
                Wait(
                    job_id=1,
                    reason=Waiting.QOS_MAX_GPUS_PER_ACCOUNT,
                    detail="2 GPUs running + 1 asked > 2",
                ),
            ),
        ),
    ),
}


@pytest.mark.parametrize(("snap", "pending", "want"), CASES.values(), ids=CASES.keys())
def test_policy(snap: Snapshot, pending: list[JobRequest], want: Plan) -> None:
    assert place(snap, pending, now=T0) == want


def test_fifo_starts_nothing_behind_a_blocked_job() -> None:
    snap, pending = backfill_case(1800)
    plan = place(snap, pending, now=T0, config=PolicyConfig(strict_order=True, backfill=False))
    assert plan == Plan(
        waits=(
            Wait(job_id=2, reason=Waiting.RESOURCES),
            Wait(job_id=3, reason=Waiting.PRIORITY, detail="in order behind job 2"),
        )
    )


def test_a_job_for_a_named_reservation_waits_for_it_then_runs_inside() -> None:
    window = Reservation(
        name="demo", start=T0 + 600, duration_s=3600, nodes=("b",), accounts=("ml",)
    )
    snap = snapshot(node("a"), node("b"), reservations=(window,))
    job = gang(1, gpus_per_node=8, account="ml", reservation="demo", time_limit_s=1800)
    early = place(snap, [job], now=T0)
    assert early == Plan(
        waits=(
            Wait(
                job_id=1,
                reason=Waiting.RESERVATION,
                detail="not open yet",
                estimated_start=T0 + 600,
            ),
        )
    )
    inside = place(snap, [job], now=T0 + 700)
    assert [(s.job_id, s.grants[0].node) for s in inside.starts] == [(1, "b")]


def test_jobs_beyond_max_job_test_are_not_tested() -> None:
    snap = snapshot(node("a", 1))
    plan = place(
        snap, [gang(1, gpus_per_node=1), gang(2, gpus_per_node=1)], T0, PolicyConfig(max_job_test=1)
    )
    assert [s.job_id for s in plan.starts] == [1]
    assert plan.waits == (
        Wait(job_id=2, reason=Waiting.NOT_TESTED, detail="beyond max_job_test this pass"),
    )


def test_an_elastic_gang_grows_only_as_far_as_the_user_cap() -> None:
    snap = snapshot(*NODES32[:4], limits=Limits(user_default=Limit(max_gpus=16)))
    plan = place(snap, [gang(1, nodes=(1, 4), gpus_per_node=8)], now=T0)
    assert [len(s.grants) for s in plan.starts] == [2]
