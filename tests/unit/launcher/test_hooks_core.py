"""Table tests of the site hooks' pure rules, and the shell's timeout on a real process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.launcher.executor import spawn_worker
from services.launcher.hooks import run_hook
from services.launcher.hooks_core import HOOK_PATH, Hook, HookResult, hook_env

JOB_ENV = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "SLURM_JOB_USER": "ann",
    "SLURM_JOB_PARTITION": "batch",
    "LD_PRELOAD": "/home/ann/evil.so",
    "PATH": "/home/ann/bin",
}


def test_a_root_hook_sees_the_jobs_slurm_variables_and_a_fixed_path_not_the_rest() -> None:
    assert hook_env(JOB_ENV, "node01", Hook.PROLOG) == {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NODELIST": "node[01-02]",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "SLURM_JOB_USER": "ann",
        "SLURM_JOB_PARTITION": "batch",
        "SLURMD_NODENAME": "node01",
        "PATH": HOOK_PATH,
        "MUSTER_HOOK": "prolog",
    }


DESCRIBE = {
    "an exit code with its last line": (
        HookResult(hook=Hook.PROLOG, path="/p", exit_code=3, output="checking\nno pkey 0x8001"),
        "prolog /p exited 3: no pkey 0x8001",
    ),
    "a timeout": (
        HookResult(hook=Hook.EPILOG, path="/e", timed_out=True),
        "epilog /e timed out and was killed",
    ),
    "a signal": (
        HookResult(hook=Hook.PROLOG, path="/p", signal=9),
        "prolog /p was killed by signal 9",
    ),
}


@pytest.mark.parametrize(("result", "want"), DESCRIBE.values(), ids=DESCRIBE.keys())
def test_describe(result: HookResult, want: str) -> None:
    assert result.describe() == want
    assert not result.ok


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hook.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


async def test_a_hook_that_hangs_is_killed_at_its_timeout_with_what_it_started(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "child.pid"
    hook = _script(tmp_path, f"sleep 300 & echo $! > {marker}\necho waiting\nwait\n")
    got = await run_hook(Hook.PROLOG, hook, {"PATH": HOOK_PATH}, timeout_s=1.0)
    assert got.timed_out and got.output == "waiting"
    assert not _running(int(marker.read_text()))


async def test_a_hook_gets_its_environment_and_its_exit_code_counts(tmp_path: Path) -> None:
    hook = _script(tmp_path, 'echo "job $SLURM_JOB_ID"; exit 4\n')
    got = await run_hook(Hook.EPILOG, hook, {"SLURM_JOB_ID": "12"}, timeout_s=30)
    assert (got.exit_code, got.output, got.ok) == (4, "job 12", False)


async def test_a_missing_hook_fails_rather_than_being_skipped(tmp_path: Path) -> None:
    got = await run_hook(Hook.PROLOG, str(tmp_path / "nope"), {}, timeout_s=5)
    assert got.exit_code == 127 and not got.ok


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker as root needs allow_root, and root")
async def test_a_task_prolog_sets_the_jobs_environment_and_prints_to_its_output(
    tmp_path: Path,
) -> None:
    hook = _script(tmp_path, 'echo "export GREETING=hello world"\necho "print from prolog"\n')
    worker = await spawn_worker(
        ["/bin/sh", "-c", 'echo "got $GREETING"'], {"PATH": HOOK_PATH}, str(tmp_path),
        "out.txt", "out.txt", allow_root=True, task_prolog=hook,
    )  # fmt: skip
    assert (await worker.wait()).exit_code == 0
    assert (tmp_path / "out.txt").read_text() == "from prolog\ngot hello world\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="a worker as root needs allow_root, and root")
async def test_a_failing_task_prolog_stops_the_job_before_its_program(tmp_path: Path) -> None:
    hook = _script(tmp_path, "exit 2\n")
    worker = await spawn_worker(
        ["/bin/sh", "-c", "echo ran"], {"PATH": HOOK_PATH}, str(tmp_path),
        "out.txt", "out.txt", allow_root=True, task_prolog=hook,
    )  # fmt: skip
    assert (await worker.wait()).exit_code == 125
    assert "TaskProlog" in (tmp_path / "out.txt").read_text()
