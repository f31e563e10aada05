"""Table test of how long a requeued run's exclusions stand (core/exclusions.py)."""

from __future__ import annotations

import pytest

from services.placer.core.exclusions import standing

CASES = {
    "a node still down stays excluded": ((("n1",), 100.0, {}), ("n1",)),
    "a node that came back after the requeue is usable again": (
        (("n1",), 100.0, {"n1": 150.0}), (),
    ),
    "a node UP since before the requeue (it refused the start) stays excluded": (
        (("n1",), 100.0, {"n1": 50.0}), ("n1",),
    ),
    "only the nodes that came back are lifted, in order": (
        (("n3", "n1", "n2"), 100.0, {"n1": 101.0, "n2": 99.0}), ("n3", "n2"),
    ),
    "no requeue time: every exclusion stands": ((("n1",), None, {"n1": 150.0}), ("n1",)),
    "nothing excluded": (((), 100.0, {"n1": 150.0}), ()),
}  # fmt: skip


@pytest.mark.parametrize(("given", "want"), CASES.values(), ids=CASES.keys())
def test_standing(
    given: tuple[tuple[str, ...], float | None, dict[str, float]], want: tuple[str, ...]
) -> None:
    assert standing(*given) == want
