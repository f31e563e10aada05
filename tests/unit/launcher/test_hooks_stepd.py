"""The step supervisor runs the site hooks around a worker, on this machine (as root):
a failing prolog means no worker and a drain-worthy exit; the epilog runs after the
worker, and its failure is recorded beside the worker's exit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.launcher.stepd import supervise
from services.launcher.worker_table import Ending, Isolation, StepSpec, touch, write_struct

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a worker as root: needs root")


def _hook(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _spec(tmp_path: Path, iso: Isolation, script: str = "", fence_s: float = 1e9) -> Path:
    folder = tmp_path / "worker"
    folder.mkdir()
    write_struct(
        folder / "spec.json",
        StepSpec(
            argv=("/bin/sh", "-c", script or f"echo ran > {tmp_path}/ran"),
            env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "42"},
            workdir=str(tmp_path), stdout="out", stderr="out", allow_root=True,
            contact=str(tmp_path / "contact"), fence_s=fence_s, grace_s=1.0, isolation=iso,
        ),
    )  # fmt: skip
    return folder


async def test_a_failing_prolog_starts_no_worker_and_says_so_for_the_drain(
    tmp_path: Path,
) -> None:
    prolog = _hook(tmp_path, "prolog", 'echo "no pkey for job $SLURM_JOB_ID"; exit 3\n')
    iso = Isolation(cgroups=False, prolog=prolog, hook_env={"SLURM_JOB_ID": "42"})
    got = await supervise(_spec(tmp_path, iso))
    assert (got.ending, got.prolog_failed) == (Ending.SPAWN_FAILED, True)
    assert got.spawn_failed == f"prolog {prolog} exited 3: no pkey for job 42"
    assert not (tmp_path / "ran").exists()


async def test_the_epilog_runs_after_the_worker_and_its_failure_is_recorded_with_the_exit(
    tmp_path: Path,
) -> None:
    epilog = _hook(tmp_path, "epilog", f'test -e {tmp_path}/ran && echo "scratch busy"; exit 1\n')
    iso = Isolation(cgroups=False, epilog=epilog)
    got = await supervise(_spec(tmp_path, iso))
    assert (got.ending, got.exit_code) == (Ending.EXITED, 0)
    assert got.epilog_failed == f"epilog {epilog} exited 1: scratch busy"


async def test_a_hanging_prolog_is_killed_at_the_timeout(tmp_path: Path) -> None:
    prolog = _hook(tmp_path, "prolog", "sleep 300\n")
    iso = Isolation(cgroups=False, prolog=prolog, hook_timeout_s=1.0)
    got = await supervise(_spec(tmp_path, iso))
    assert got.prolog_failed and "timed out" in got.spawn_failed


async def test_the_epilog_runs_when_the_record_was_taken_away_under_the_worker(
    tmp_path: Path,
) -> None:
    """The agent gave the start up (its record removed while the worker ran): stepd has
    nowhere to write the exit, and still runs the site epilog."""
    epilog = _hook(tmp_path, "epilog", f": > {tmp_path}/epilog-ran\n")
    iso = Isolation(cgroups=False, epilog=epilog)
    folder = tmp_path / "worker"
    got = await supervise(_spec(tmp_path, iso, f"sleep 0.2; rm -rf {folder}"))
    assert got.ending in (Ending.EXITED, Ending.STOPPED)  # exited, or stopped unrecorded
    assert not folder.exists()
    assert (tmp_path / "epilog-ran").exists()


async def test_a_node_cut_off_while_the_prolog_runs_never_begins_the_worker(
    tmp_path: Path,
) -> None:
    """The contact went stale past the fence while the prolog ran (the job is being
    restarted elsewhere): stepd records FENCED and spawns nothing; the epilog runs, as
    the prolog did (before, the worker began and was fenced a poll later)."""
    prolog = _hook(tmp_path, "prolog", "sleep 3\n")
    epilog = _hook(tmp_path, "epilog", f": > {tmp_path}/epilog-ran\n")
    touch(tmp_path / "contact")  # fresh now, 3 s old after the prolog: past the fence
    iso = Isolation(cgroups=False, prolog=prolog, epilog=epilog)
    folder = _spec(tmp_path, iso, fence_s=2.0)
    got = await supervise(folder)
    assert (got.ending, got.signal) == (Ending.FENCED, 15)
    assert not (folder / "started.json").exists()  # no worker was spawned
    assert (tmp_path / "epilog-ran").exists()
