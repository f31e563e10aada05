"""What a request naming a job the database does not hold is told
(services/admission/purge.py): that a finished job may have been purged, and after how
long, when the cluster purges them."""

from __future__ import annotations

import pytest

from services.admission.purge import missing_dependencies, missing_job
from shared.retention import DAY_S

YEAR = 365 * DAY_S
SAID = "no such job: 7 (never submitted, or finished more than"


@pytest.mark.parametrize(
    ("kept_s", "said"),
    [
        (None, "no such job: 7"),
        (YEAR, "no such job: 7 (never submitted, or finished more than 365 days ago and purged)"),
        (
            8 * DAY_S,
            "no such job: 7 (never submitted, or finished more than 8 days ago and purged)",
        ),
        (DAY_S, "no such job: 7 (never submitted, or finished more than 24 hours ago and purged)"),
    ],
)
def test_a_request_for_a_job_not_held_says_it_may_have_been_purged(
    kept_s: float | None, said: str
) -> None:
    assert missing_job(7, kept_s) == said


def test_a_dependency_on_a_job_not_held_is_refused_saying_what_to_check() -> None:
    said = "--dependency names job(s) that do not exist: 7, 9; check the ids with `muster queue -a`"
    assert missing_dependencies([7, 9], None) == said
    purged = " (a finished job is purged 365 days after its end)"
    assert missing_dependencies([7, 9], YEAR) == said + purged
