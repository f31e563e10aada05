"""Golden scenarios: recorded snapshots replayed through place(), whole plans compared.

Regenerate with `.venv/bin/python -m tests.unit.placer.make_golden` and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.placer.core import place
from tests.unit.placer.make_golden import GOLDEN, Scenario

FILES = sorted(GOLDEN.glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_golden_scenario_replays_to_its_recorded_plan(path: Path) -> None:
    sc = msgspec.json.decode(path.read_bytes(), type=Scenario)
    assert place(sc.snapshot, sc.pending, now=sc.now, config=sc.config) == sc.want


def test_there_are_golden_scenarios() -> None:
    assert len(FILES) >= 2
