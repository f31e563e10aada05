"""Exactly-once charging: redelivered, late and out-of-order ticks never double-charge."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.fairshare.accounting import (
    AttemptCharge,
    Charge,
    UsageTick,
    accrue,
    charge,
    cumulative_gpu_seconds,
    settle,
    tick_from_event,
    usage_by_account,
)
from services.fairshare.tree import Assoc
from shared.events import JobFinished, JobRequeued, UsageTicked

WEIGHTS = {"H100": 2.0, "A100": 1.0}


def tick(
    total: float,
    at: float = 0.0,
    *,
    final: bool = False,
    model: str | None = "H100",
    attempt: int = 0,
) -> UsageTick:
    return UsageTick(
        job_id=7,
        attempt=attempt,
        user="ada",
        account="physics",
        gpu_model=model,
        at=at,
        gpu_seconds_total=total,
        final=final,
    )


def state(
    charged: float,
    billed: float,
    last_at: float,
    *,
    settled: bool = False,
    model: str | None = "H100",
) -> AttemptCharge:
    return AttemptCharge(
        job_id=7,
        attempt=0,
        user="ada",
        account="physics",
        charged=charged,
        billed=billed,
        last_at=last_at,
        settled=settled,
        gpu_model=model,
    )


def delta(gpu_seconds: float, billed: float, at: float) -> Charge:
    return Charge(
        job_id=7,
        attempt=0,
        user="ada",
        account="physics",
        gpu_seconds=gpu_seconds,
        billed=billed,
        at=at,
    )


CASES: dict[str, tuple[AttemptCharge | None, UsageTick, AttemptCharge, Charge]] = {
    "the first tick charges everything so far at the model's weight": (
        None,
        tick(80, at=10),
        state(80, 160, 10),
        delta(80, 160, 10),
    ),
    "the next tick charges only the difference": (
        state(80, 160, 10),
        tick(240, at=30),
        state(240, 480, 30),
        delta(160, 320, 30),
    ),
    "a redelivered tick charges nothing": (
        state(240, 480, 30),
        tick(240, at=30),
        state(240, 480, 30),
        delta(0, 0, 30),
    ),
    "a late tick from before the last one charges nothing, never a refund": (
        state(240, 480, 30),
        tick(80, at=10),
        state(240, 480, 30),
        delta(0, 0, 10),
    ),
    "settlement charges the remainder and closes the attempt": (
        state(240, 480, 30),
        tick(300, at=40, final=True),
        state(300, 600, 40, settled=True),
        delta(60, 120, 40),
    ),
    "settlement that finds nothing left still closes the attempt": (
        state(300, 600, 40),
        tick(300, at=41, final=True),
        state(300, 600, 40, settled=True),
        delta(0, 0, 41),
    ),
    "a tick after settlement charges nothing": (
        state(300, 600, 40, settled=True),
        tick(999, at=50),
        state(300, 600, 40, settled=True),
        delta(0, 0, 50),
    ),
    "a settlement that does not name the model is billed like the ticks": (
        state(240, 480, 30),
        tick(300, at=40, final=True, model=None),
        state(300, 600, 40, settled=True),
        delta(60, 120, 40),
    ),
    "an unknown model weighs one": (
        None,
        tick(50, at=5, model="V100"),
        state(50, 50, 5, model="V100"),
        delta(50, 50, 5),
    ),
}


@pytest.mark.parametrize(
    ("before", "t", "want_state", "want_charge"), CASES.values(), ids=CASES.keys()
)
def test_charge(
    before: AttemptCharge | None, t: UsageTick, want_state: AttemptCharge, want_charge: Charge
) -> None:
    assert charge(before, t, WEIGHTS) == (want_state, want_charge)


def test_a_tick_of_another_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match=r"7\.1 applied to 7\.0"):
        charge(state(0, 0, 0), tick(10, attempt=1))


def test_settle_marks_the_tick_final() -> None:
    assert settle(None, tick(10, at=3), WEIGHTS) == (
        state(10, 20, 3, settled=True),
        delta(10, 20, 3),
    )


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[UsageTick], int]:
    """An attempt's ticks (cumulative, rising) and settlement, redelivered and shuffled."""
    steps = draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=12))
    totals = [sum(steps[: i + 1]) for i in range(len(steps))]
    ticks = [tick(float(t), at=float(i)) for i, t in enumerate(totals)]
    final = totals[-1] + draw(st.integers(min_value=0, max_value=500))
    ticks.append(tick(float(final), at=float(len(totals)), final=True))
    repeated = draw(st.lists(st.sampled_from(ticks), max_size=20))
    return draw(st.permutations(ticks + repeated)), final


@given(deliveries())
def test_any_order_of_redelivered_ticks_charges_exactly_the_final_total(
    delivered: tuple[list[UsageTick], int],
) -> None:
    ticks, final = delivered
    current: AttemptCharge | None = None
    charged = 0.0
    billed = 0.0
    for t in ticks:
        current, c = charge(current, t, WEIGHTS)
        charged += c.gpu_seconds
        billed += c.billed
        assert c.gpu_seconds >= 0
    assert current is not None
    assert (charged, billed, current.charged, current.settled) == (final, 2 * final, final, True)


def test_events_become_ticks_and_settlements() -> None:
    t0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    ticked = UsageTicked(
        job_id=7,
        attempt=0,
        user="ada",
        account="physics",
        gpu_model="H100",
        gpu_seconds_total=80.0,
        occurred_at=t0,
    )
    finished = JobFinished(
        job_id=7,
        attempt=0,
        state="COMPLETED",
        user="ada",
        account="physics",
        gpu_seconds=300.0,
        gpu_model="H100",
        ended_at=t0,
        occurred_at=t0,
    )
    requeued = JobRequeued(
        job_id=7,
        attempt=0,
        reason="node fault",
        gpu_seconds=120.0,
        user="ada",
        account="physics",
        occurred_at=t0,
    )
    ts = t0.timestamp()
    assert [tick_from_event(e) for e in (ticked, finished, requeued)] == [
        tick(80.0, at=ts),
        tick(300.0, at=ts, final=True),
        tick(120.0, at=ts, final=True, model=None),
    ]


def test_usage_accrues_per_user_association_and_sums_per_account() -> None:
    charges = (
        Charge(job_id=1, attempt=0, user="ada", account="physics", gpu_seconds=10, billed=20),
        Charge(job_id=2, attempt=0, user="bob", account="physics", gpu_seconds=5, billed=5),
        Charge(job_id=3, attempt=0, user="ada", account="physics", gpu_seconds=0, billed=0),
        Charge(job_id=4, attempt=0, user="ada", account="bio", gpu_seconds=1, billed=1),
    )
    usage = accrue({Assoc("physics", "ada"): 100.0}, charges)
    assert usage == {
        Assoc("physics", "ada"): 120.0,
        Assoc("physics", "bob"): 5.0,
        Assoc("bio", "ada"): 1.0,
    }
    assert usage_by_account(usage) == {"physics": 125.0, "bio": 1.0}


def test_cumulative_gpu_seconds_counts_gpus_times_time_held() -> None:
    assert [cumulative_gpu_seconds(8, 100.0, t) for t in (50.0, 100.0, 160.0)] == [0.0, 0.0, 480.0]


def test_a_settlement_below_a_tick_that_overshot_gives_the_difference_back() -> None:
    # A tick stamped a moment past the attempt's end (seen in a chaos run: 5.718 charged,
    # 5.712 used): the settlement is the attempt's total, so the charges sum to it.
    base: dict[str, Any] = {"job_id": 42, "attempt": 2, "user": "alice", "account": "physics"}
    state, first = charge(None, UsageTick(**base, at=10.0, gpu_seconds_total=5.718))
    state, last = charge(state, UsageTick(**base, at=9.9, gpu_seconds_total=5.712, final=True))
    assert round(first.gpu_seconds + last.gpu_seconds, 9) == 5.712
    assert round(last.gpu_seconds, 9) == -0.006
    assert state.settled and state.charged == 5.712
