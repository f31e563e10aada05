"""What the node agent keeps on disk across its restarts (services/launcher/kept.py):
each instance is a restarted agent reading the folder the last one wrote."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from services.launcher.kept import KeptKeys, KeptOutcomes, KeptStops
from shared.api import StepOutcome


def test_kept_generations_are_known_to_the_next_agent(tmp_path: Path) -> None:
    first = KeptKeys(tmp_path / "ended", limit=10)
    first.add((7, 1, 0))
    first.add((7, 1, 0))  # again: one entry
    first.add((8, 2, 3))
    again = KeptKeys(tmp_path / "ended", limit=10)
    assert (7, 1, 0) in again and (8, 2, 3) in again and (7, 1, 1) not in again
    assert len(again) == 2


def test_past_the_limit_the_oldest_go_from_memory_and_disk(tmp_path: Path) -> None:
    kept = KeptKeys(tmp_path / "k", limit=3)
    for job in range(5):
        kept.add((job, 0, 0))
    assert [job for job in range(5) if (job, 0, 0) in kept] == [2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["2-0-0", "3-0-0", "4-0-0"]


def test_a_restart_with_a_smaller_limit_keeps_the_newest_and_ignores_strangers(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "k"
    folder.mkdir()
    for age, name in enumerate(("1-0-0", "2-0-0", "3-0-0")):  # 1 the oldest
        (folder / name).touch()
        os.utime(folder / name, ns=(10**9 * (100 + age),) * 2)
    (folder / "notes.txt").write_text("not a generation")
    kept = KeptKeys(folder, limit=2)
    assert (1, 0, 0) not in kept and (2, 0, 0) in kept and (3, 0, 0) in kept
    assert sorted(p.name for p in folder.iterdir()) == ["2-0-0", "3-0-0", "notes.txt"]


def test_an_unwritable_folder_keeps_the_entry_in_memory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    kept = KeptKeys(tmp_path / "file" / "ended", limit=5)  # under a file: cannot be made
    kept.add((1, 0, 0))
    assert (1, 0, 0) in kept
    stops = KeptStops(tmp_path / "file" / "stops", keep_s=60)
    stops.add(1, "/out", 2.0)
    assert stops.grace(1, "/out") == 2.0


def test_srun_stops_are_known_to_the_next_agent_until_they_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = KeptStops(tmp_path / "stops", keep_s=600)
    first.add(5, "/home/u/out", 3.0)
    first.add(5, "/home/u/other", 1.0)
    again = KeptStops(tmp_path / "stops", keep_s=600)
    assert again.grace(5, "/home/u/out") == 3.0 and again.grace(5, "/home/u/other") == 1.0
    assert again.grace(6, "/home/u/out") is None
    later = time.time() + 601
    monkeypatch.setattr("services.launcher.kept.time.time", lambda: later)
    expired = KeptStops(tmp_path / "stops", keep_s=600)
    assert expired.grace(5, "/home/u/out") is None
    assert list((tmp_path / "stops").iterdir()) == [], "an expired stop's file goes"


def test_step_outcomes_are_known_to_the_next_agent_until_they_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = StepOutcome(ok=True, exit_codes=(0, 3), signals=(None, None), stopped=(False, False))
    KeptOutcomes(tmp_path / "o", keep_s=600).add((9, 1, 0, 2), done)
    again = KeptOutcomes(tmp_path / "o", keep_s=600)
    assert again.get((9, 1, 0, 2)) == done and again.get((9, 1, 0, 3)) is None
    later = time.time() + 601
    monkeypatch.setattr("services.launcher.kept.time.time", lambda: later)
    assert KeptOutcomes(tmp_path / "o", keep_s=600).get((9, 1, 0, 2)) is None
    assert list((tmp_path / "o").iterdir()) == []
