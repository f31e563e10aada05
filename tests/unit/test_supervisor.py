"""The supervisor's restart backoff (`muster.supervisor.next_restart`): a table."""

from __future__ import annotations

import pytest

from muster.supervisor import BASE_S, MAX_S, STABLE_S, Restart, next_restart

QUICK = 1.0  # seconds a process ran before it exited: well under STABLE_S
RESTARTS = {
    "a first quick exit restarts at once": ((0, QUICK), Restart(delay_s=BASE_S, failures=1)),
    "each quick exit in a row doubles the wait": (
        (3, QUICK),
        Restart(delay_s=8 * BASE_S, failures=4),
    ),
    "the wait never exceeds the cap": ((20, QUICK), Restart(delay_s=MAX_S, failures=21)),
    "a process that stayed up starts afresh": ((20, STABLE_S), Restart(delay_s=BASE_S, failures=1)),
}


@pytest.mark.parametrize(("given", "want"), RESTARTS.values(), ids=RESTARTS.keys())
def test_next_restart(given: tuple[int, float], want: Restart) -> None:
    assert next_restart(*given) == want
