"""`scancel JOB.STEP` (muster/step_refs.py): which references name steps."""

from __future__ import annotations

import pytest

from muster.step_refs import split


@pytest.mark.parametrize(
    ("refs", "steps", "others"),
    [
        (["12.3"], [(12, 3)], []),
        (["12", "12.0", "7_2", "8_[1-3]"], [(12, 0)], ["12", "7_2", "8_[1-3]"]),
        ([" 5.1 "], [(5, 1)], []),
        (["5.", ".1", "5.x", "5.1.2"], [], ["5.", ".1", "5.x", "5.1.2"]),  # admission says why
    ],
)
def test_step_references_are_told_from_job_references(
    refs: list[str], steps: list[tuple[int, int]], others: list[str]
) -> None:
    assert split(refs) == (steps, others)
