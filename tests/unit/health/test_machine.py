"""`services.health.machine`: the CPUs and memory a node announces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.health.machine import machine_size, meminfo_mib

MEMINFO = {
    "MemTotal in kB": ("MemTotal:       24576000 kB\nMemFree:  100 kB\n", 24000),
    "after other lines": ("MemFree:  100 kB\nMemTotal:  2048 kB\n", 2),
    "absent": ("MemFree:  100 kB\n", 0),
    "not a number": ("MemTotal:  lots kB\n", 0),
}


@pytest.mark.parametrize(("text", "mib"), MEMINFO.values(), ids=MEMINFO.keys())
def test_meminfo_mib(text: str, mib: int) -> None:
    assert meminfo_mib(text) == mib


def test_the_settings_say_the_size_else_the_machine_does(tmp_path: Path) -> None:
    assert machine_size(8, 4096, tmp_path / "none") == (8, 4096)
    (tmp_path / "meminfo").write_text("MemTotal:  1048576 kB\n")
    assert machine_size(0, 0, tmp_path / "meminfo") == (len(os.sched_getaffinity(0)), 1024)
    assert machine_size(0, 0, tmp_path / "none")[1] == 0  # unreadable: not known
