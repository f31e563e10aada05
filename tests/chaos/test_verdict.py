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


def test_a_job_failed_by_anything_but_an_application_xid_is_unexplained() -> None:
    report = Report(7)
    report.failed = {
        3: "FAILED: application fault on node02: xid 13 (application)",  # by design
        5: "FAILED: worker on node01 ended with signal SIGTERM",
        9: "NODE_FAIL: node node03 lost: xid 79; restart limit of 3 reached",
    }
    assert report.verdict() == ""  # no invariant broke: the run's folder is kept for all that
    assert sorted(report.unexplained()) == [5, 9]
