"""Half-life decay arithmetic and the calendar of usage resets (UTC)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.fairshare.decay import (
    HALF_LIFE_DEFAULT_S,
    ResetPeriod,
    advance,
    decay,
    decay_all,
    period_start,
    reset_due,
)
from services.fairshare.tree import Assoc

DAY = 86400.0


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


DECAY_CASES = {
    "after one half-life usage halves": (1000.0, HALF_LIFE_DEFAULT_S, HALF_LIFE_DEFAULT_S, 500.0),
    "after two half-lives a quarter is left": (1000.0, 2 * 7 * DAY, 7 * DAY, 250.0),
    "the default half-life is Slurm's seven days": (8.0, 21 * DAY, HALF_LIFE_DEFAULT_S, 1.0),
    "no time elapsed changes nothing": (1000.0, 0.0, 7 * DAY, 1000.0),
    "a clock that ran backwards changes nothing": (1000.0, -5.0, 7 * DAY, 1000.0),
    "a half-life of zero turns decay off": (1000.0, 365 * DAY, 0.0, 1000.0),
}


@pytest.mark.parametrize(
    ("usage", "elapsed", "half_life", "want"), DECAY_CASES.values(), ids=DECAY_CASES.keys()
)
def test_decay(usage: float, elapsed: float, half_life: float, want: float) -> None:
    assert decay(usage, elapsed, half_life) == want


amounts = st.floats(min_value=0, max_value=1e12, allow_nan=False)
spans = st.floats(min_value=0, max_value=1e8, allow_nan=False)
half_lives = st.floats(min_value=1, max_value=1e8, allow_nan=False)


@given(u=amounts, a=spans, b=spans, h=half_lives)
def test_decaying_by_a_then_b_equals_decaying_by_a_plus_b(
    u: float, a: float, b: float, h: float
) -> None:
    assert math.isclose(
        decay(decay(u, a, h), b, h), decay(u, a + b, h), rel_tol=1e-9, abs_tol=1e-300
    )


@given(u=amounts, a=spans, h=half_lives)
def test_decay_never_grows_usage_nor_makes_it_negative(u: float, a: float, h: float) -> None:
    assert 0.0 <= decay(u, a, h) <= u


def test_decay_all_decays_every_association_alike() -> None:
    got = decay_all({Assoc("A", "x"): 100.0, Assoc("B"): 10.0}, 7 * DAY, 7 * DAY)
    assert got == {Assoc("A", "x"): 50.0, Assoc("B"): 5.0}


RESET_CASES = {
    "none never resets": (at("2026-01-01T00:00:00"), at("2027-06-01T00:00:00"), "none", False),
    "daily resets after midnight": (
        at("2026-11-28T23:59:00"),
        at("2026-11-29T00:00:00"),
        "daily",
        True,
    ),
    "daily does not reset twice in a day": (
        at("2026-11-29T00:00:00"),
        at("2026-11-29T23:59:59"),
        "daily",
        False,
    ),
    # 2026-11-29 is a Sunday
    "weekly resets on sunday at midnight": (
        at("2026-11-28T12:00:00"),
        at("2026-11-29T00:00:01"),
        "weekly",
        True,
    ),
    "weekly does not reset on monday again": (
        at("2026-11-29T00:00:00"),
        at("2026-11-30T09:00:00"),
        "weekly",
        False,
    ),
    "monthly resets on the first": (
        at("2026-11-30T22:00:00"),
        at("2026-12-01T00:00:00"),
        "monthly",
        True,
    ),
    "monthly waits for the first": (
        at("2026-11-01T00:00:00"),
        at("2026-11-30T23:59:59"),
        "monthly",
        False,
    ),
    "quarterly resets on october the first": (
        at("2026-09-30T00:00:00"),
        at("2026-10-01T00:00:00"),
        "quarterly",
        True,
    ),
    "quarterly waits across november": (
        at("2026-10-01T00:00:00"),
        at("2026-12-31T00:00:00"),
        "quarterly",
        False,
    ),
    "yearly resets on new year": (
        at("2026-12-31T23:00:00"),
        at("2027-01-01T00:00:00"),
        "yearly",
        True,
    ),
    "a missed boundary long ago is still due": (
        at("2026-01-15T00:00:00"),
        at("2026-11-29T12:00:00"),
        "monthly",
        True,
    ),
}


@pytest.mark.parametrize(
    ("last", "now", "period", "want"), RESET_CASES.values(), ids=RESET_CASES.keys()
)
def test_reset_due(last: float, now: float, period: str, want: bool) -> None:
    assert reset_due(last, now, period) is want


def test_never_reset_is_due_at_once_unless_resets_are_off() -> None:
    now = at("2026-11-29T12:00:00")
    assert (reset_due(None, now, ResetPeriod.DAILY), reset_due(None, now, ResetPeriod.NONE)) == (
        True,
        False,
    )


def test_period_start_is_the_latest_boundary() -> None:
    now = at("2026-11-29T12:34:56")  # Sunday
    assert {p.value: period_start(now, p) for p in ResetPeriod} == {
        "none": None,
        "daily": at("2026-11-29T00:00:00"),
        "weekly": at("2026-11-29T00:00:00"),
        "monthly": at("2026-11-01T00:00:00"),
        "quarterly": at("2026-10-01T00:00:00"),
        "yearly": at("2026-01-01T00:00:00"),
    }
    saturday = at("2026-11-28T12:00:00")
    assert period_start(saturday, ResetPeriod.WEEKLY) == at("2026-11-22T00:00:00")


def test_advance_decays_between_resets_and_starts_over_at_a_boundary() -> None:
    usage = {Assoc("A", "x"): 100.0}
    monday = at("2026-11-23T00:00:00")
    saturday = at("2026-11-28T00:00:00")
    sunday = at("2026-11-29T00:00:00")
    kept = advance(
        usage, monday, monday + DAY, half_life_s=DAY, period="weekly", last_reset=monday - DAY
    )
    wiped = advance(usage, saturday, sunday, half_life_s=DAY, period="weekly", last_reset=monday)
    assert (kept, wiped) == (({Assoc("A", "x"): 50.0}, monday - DAY), ({}, sunday))
