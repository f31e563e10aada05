"""Table tests of exit statuses (services/launcher/exitstatus.py)."""

from __future__ import annotations

import signal

import pytest

from services.launcher.exitstatus import (
    ExitStatus,
    from_returncode,
    from_wait_status,
    oom_verdict,
    parse_oom_kills,
)

RETURNCODE_CASES = {
    "zero is success": (0, ExitStatus(exit_code=0), "exit 0", "0:0", True),
    "a non-zero exit is kept": (3, ExitStatus(exit_code=3), "exit 3", "3:0", False),
    "negative means killed by that signal": (
        -9, ExitStatus(signal=9), "signal SIGKILL", "0:9", False,
    ),
    "a shell's 128+N stays an exit code": (
        137, ExitStatus(exit_code=137), "exit 137", "137:0", False,
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("rc", "want", "text", "slurm", "ok"), RETURNCODE_CASES.values(), ids=RETURNCODE_CASES.keys()
)
def test_from_returncode(rc: int, want: ExitStatus, text: str, slurm: str, ok: bool) -> None:
    got = from_returncode(rc)
    assert (got, got.describe(), got.slurm_exit_code(), got.ok) == (want, text, slurm, ok)


WAIT_CASES = {
    "exited 0": (0x0000, ExitStatus(exit_code=0)),
    "exited 2": (0x0200, ExitStatus(exit_code=2)),
    "killed by SIGTERM": (int(signal.SIGTERM), ExitStatus(signal=15)),
    "killed by SIGSEGV with a core dump": (0x80 | int(signal.SIGSEGV), ExitStatus(signal=11)),
}


@pytest.mark.parametrize(("status", "want"), WAIT_CASES.values(), ids=WAIT_CASES.keys())
def test_from_wait_status(status: int, want: ExitStatus) -> None:
    assert from_wait_status(status) == want


def test_a_stopped_process_has_no_exit_status() -> None:
    with pytest.raises(ValueError, match="stopped"):
        from_wait_status(0x137F)  # WIFSTOPPED by SIGSTOP


EVENTS = "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\noom_group_kill 0\n"

OOM_CASES = {
    "a SIGKILL while the counter rose is an OOM kill": (ExitStatus(signal=9), 0, 1, True),
    "a failed exit while the counter rose is an OOM kill": (ExitStatus(exit_code=1), 3, 4, True),
    "a SIGKILL with a flat counter is not": (ExitStatus(signal=9), 1, 1, False),
    "success is never an OOM kill": (ExitStatus(exit_code=0), 0, 5, False),
    "an unreadable counter detects nothing": (ExitStatus(signal=9), None, None, False),
}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "before", "after", "want"), OOM_CASES.values(), ids=OOM_CASES.keys()
)
def test_oom_verdict(status: ExitStatus, before: int | None, after: int | None, want: bool) -> None:
    got = oom_verdict(status, before, after)
    assert got.oom_killed is want
    assert got.describe() == ("out of memory" if want else status.describe())


def test_parse_oom_kills_reads_the_counter_or_nothing() -> None:
    assert (parse_oom_kills(EVENTS), parse_oom_kills("low 0\n")) == (1, None)
