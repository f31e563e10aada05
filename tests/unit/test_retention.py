"""The pruner's pure rules (shared/retention.py): how long the inbox keeps, when a pass
takes another batch, and what a DELETE status says."""

from __future__ import annotations

from typing import cast

import pytest

from shared.bus import STREAM_MAX_AGE_S
from shared.db import Pool
from shared.retention import (
    BACKLOG_PAUSE_S,
    DAY_S,
    ROUNDS,
    Kept,
    Pruned,
    Pruner,
    _count,
    go_on,
    inbox_keep_s,
    kept_for,
    pause_s,
)


@pytest.mark.parametrize(
    ("asked_s", "kept_s"),
    [
        (0.0, STREAM_MAX_AGE_S + DAY_S),  # never less than the stream can redeliver
        (3600.0, STREAM_MAX_AGE_S + DAY_S),
        (STREAM_MAX_AGE_S, STREAM_MAX_AGE_S + DAY_S),
        (30 * DAY_S, 30 * DAY_S),  # longer: as asked
    ],
)
def test_the_inbox_keeps_at_least_what_the_stream_can_redeliver(
    asked_s: float, kept_s: float
) -> None:
    assert inbox_keep_s(asked_s) == kept_s


@pytest.mark.parametrize(
    ("asked_s", "floor_s", "kept_s"),
    [
        (0.0, DAY_S, None),  # 0: kept for ever
        (-1.0, DAY_S, None),
        (3600.0, DAY_S, DAY_S),  # never less than the floor
        (365 * DAY_S, 8 * DAY_S, 365 * DAY_S),  # longer: as asked
    ],
)
def test_a_services_own_record_is_kept_as_asked_above_its_floor_or_for_ever(
    asked_s: float, floor_s: float, kept_s: float | None
) -> None:
    assert kept_for(asked_s, floor_s) == kept_s


@pytest.mark.parametrize(
    ("removed", "rounds", "more"),
    [
        (5_000, 0, True),  # a full batch: more may be old enough
        (5_000, ROUNDS - 1, True),
        (5_000, ROUNDS, False),  # the pass has taken its rounds: the next pass goes on
        (4_999, 1, False),  # a short batch: nothing older is left
        (0, 0, False),
    ],
)
def test_a_pass_takes_another_batch_only_after_a_full_one(
    removed: int, rounds: int, more: bool
) -> None:
    assert go_on(removed, 5_000, rounds) is more


@pytest.mark.parametrize(("status", "n"), [("DELETE 0", 0), ("DELETE 5000", 5000)])
def test_the_rows_a_delete_removed_are_read_from_its_status(status: str, n: int) -> None:
    assert _count(status) == n


@pytest.mark.parametrize(
    ("pruned", "every_s", "wait_s"),
    [
        (Pruned(0, 0), 600.0, 600.0),
        (Pruned(3, 70, more=False), 600.0, 600.0),  # all that was old went: a period
        (Pruned(100_000, 0, more=True), 600.0, BACKLOG_PAUSE_S),  # a backlog: soon
        (Pruned(100_000, 0, more=True), 0.2, 0.2),  # never later than the period
    ],
)
def test_a_backlog_is_taken_in_passes_a_moment_apart_not_a_period(
    pruned: Pruned, every_s: float, wait_s: float
) -> None:
    assert pause_s(pruned, every_s) == wait_s


def test_a_table_kept_as_a_setting_says_is_trimmed_unless_kept_for_ever() -> None:
    pruner = Pruner(cast(Pool, None))  # registering touches no database
    assert pruner.keep_as_set("DELETE a", 0.0, DAY_S) is None  # 0: kept for ever
    assert pruner.keep_as_set("DELETE b", 3600.0, DAY_S) == DAY_S  # never under the floor
    assert pruner.keep_as_set("SELECT c()", 9 * DAY_S, DAY_S, counts=True) == 9 * DAY_S
    assert pruner.own == [Kept("DELETE b", DAY_S), Kept("SELECT c()", 9 * DAY_S, counts=True)]
