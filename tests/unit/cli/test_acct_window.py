"""`sacct -S/-E` (muster/acct_window.py): Slurm's instants read as the past, in the
local time zone passed in; since midnight today without -S, unless -j names jobs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from muster.acct_window import WindowError, acct_window

NOW = datetime(2026, 12, 7, 15, 30, tzinfo=UTC).timestamp()  # a Monday afternoon


def at(year: int, month: int, day: int, hour: int = 0) -> float:
    return datetime(year, month, day, hour, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("start", "end", "by_job", "window"),
    [
        (None, None, False, (at(2026, 12, 7), None)),  # Slurm's default: since midnight
        (None, None, True, (None, None)),  # -j: any time
        ("2026-12-01", "2026-12-02T12:00", False, (at(2026, 12, 1), at(2026, 12, 2, 12))),
        ("now-2days", "now", False, (NOW - 2 * 86400, NOW)),
        ("08:00", None, False, (at(2026, 12, 7, 8), None)),  # this morning
        ("16:00", None, False, (at(2026, 12, 6, 16), None)),  # not yet today: yesterday's
        ("12/24", None, False, (at(2025, 12, 24), None)),  # the last 24 December
        ("1201", None, False, (at(2026, 12, 1), None)),  # MMDD
        ("midnight", None, True, (at(2026, 12, 7), None)),
        ("1764000000", None, False, (1764000000.0, None)),  # epoch seconds
    ],
)
def test_the_window(
    start: str | None, end: str | None, by_job: bool, window: tuple[float | None, float | None]
) -> None:
    assert acct_window(start, end, by_job=by_job, now=NOW, tz=UTC) == window


@pytest.mark.parametrize(
    ("start", "end", "said"),
    [
        ("yesterdayish", None, "invalid -S 'yesterdayish': expected now[{+|-}N"),
        ("now-3fortnights", None, "invalid -S 'now-3fortnights': unknown unit 'fortnights'"),
        ("2026-13-01", None, "invalid -S '2026-13-01': month must be in 1..12"),
        ("now", "now-1day", "-E now-1day is before -S now"),
    ],
)
def test_a_time_sacct_cannot_read_says_what_it_takes(
    start: str, end: str | None, said: str
) -> None:
    with pytest.raises(WindowError) as err:
        acct_window(start, end, by_job=False, now=NOW, tz=UTC)
    assert str(err.value).startswith(said), str(err.value)
