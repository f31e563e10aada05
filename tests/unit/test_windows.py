"""`shared.windows.occurrence`: a window open now, else the next."""

from __future__ import annotations

import pytest

from shared.windows import occurrence

DAY = 86_400.0
T = 1_700_000_000.0

CASES = {
    "one-off, ahead": ((T + 100, 3600, "none", T), (T + 100, T + 3700)),
    "one-off, past: its own": ((T - 7200, 3600, "none", T), (T - 7200, T - 3600)),
    "daily, open now": ((T - 600, 3600, "daily", T), (T - 600, T + 3000)),
    "daily, over today: tomorrow's": (
        (T - 7200, 3600, "daily", T), (T - 7200 + DAY, T - 3600 + DAY),
    ),
    "weekly, weeks on, any case": (
        (T - 3 * 7 * DAY - 10, 3600, "WEEKLY", T), (T - 10, T + 3590),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("given", "want"), CASES.values(), ids=CASES.keys())
def test_occurrence(given: tuple[float, int, str, float], want: tuple[float, float]) -> None:
    assert occurrence(*given) == want
