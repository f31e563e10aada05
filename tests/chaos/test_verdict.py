"""Table test of a chaos run's verdict (`Report.verdict`): empty only when the run kept
everything; else the replay line, where the run's logs were kept, and what broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.harness import Report

KEPT = Path("/tmp/muster-chaos-7-example")

CASES: dict[str, tuple[Report, list[str]]] = {
    "a run that kept everything": (Report(7), []),
    "a service that exited": (
        Report(7, services_exited=["placer"], folder=KEPT),
        [
            f"chaos seed 7 failed; replay: MUSTER_CHAOS_SEED=7 pytest tests/chaos; logs in {KEPT}",
            "placer exited during the run",
        ],
    ),
    "orphans on an unsecured bed": (
        Report(7, orphans=2, secure=False, folder=KEPT),
        [
            "chaos seed 7 failed; replay: MUSTER_CHAOS_INSECURE=1 MUSTER_CHAOS_SEED=7 pytest"
            f" tests/chaos; logs in {KEPT}",
            "2 worker processes outlived the run",
        ],
    ),
}


@pytest.mark.parametrize("report,lines", CASES.values(), ids=CASES.keys())
def test_verdict(report: Report, lines: list[str]) -> None:
    assert report.verdict().splitlines() == lines
