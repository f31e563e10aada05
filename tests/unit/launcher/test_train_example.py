"""examples/train_elastic.py under torchrun on CPU, launched the way Muster launches it.

The command line comes from `torchrun_argv`, the environment from `build_env`, and the
process from `spawn_worker`: the launcher's real path on one node. The first attempt
runs 2 processes and is stopped mid-run (as the coordinator stops a job whose node
failed); the second attempt, at world size 1 (shrunk), resumes from the checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import pytest

from services.launcher.env import build_env, place_worker
from services.launcher.executor import Worker, free_port, spawn_worker
from services.launcher.torchrun import fill_on_node, torchrun_argv
from shared.jobspec import JobSpec

pytest.importorskip("torch", reason="torch (CPU) is needed to run the training example")

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parents[3] / "examples" / "train_elastic.py")


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def launch(tmp: Path, *, attempt: int, procs: int, args: tuple[str, ...]) -> Worker:
    spec = JobSpec(
        user="alice", script=SCRIPT, args=args, torchrun=True, ntasks_per_node=procs,
        workdir=str(tmp), nodes_min=1, nodes_max=2, elastic=True,
    )  # fmt: skip
    placement = place_worker(
        spec, job_id=7, attempt=1, generation=attempt, node="127.0.0.1",
        nodelist=["127.0.0.1"], gpus=[], master_port=free_port("127.0.0.1"),
    )  # fmt: skip
    env = build_env(spec, placement, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return await spawn_worker(
        [fill_on_node(a, spool=str(tmp), address="127.0.0.1")
         for a in torchrun_argv(spec, placement, sys.executable)],
        env, str(tmp),
        f"attempt{attempt}.out", f"attempt{attempt}.err", allow_root=True,
    )  # fmt: skip


async def wait_for(path: Path, pattern: str, worker: Worker, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not re.search(pattern, read(path)):
        assert worker.status is None, read(path.with_suffix(".err"))
        assert time.monotonic() < deadline, f"{pattern!r} not in {path}"
        await asyncio.sleep(0.05)


async def test_training_is_stopped_mid_run_and_resumes_from_its_checkpoint_shrunk(
    tmp_path: Path,
) -> None:
    ckpt = ("--ckpt-dir", str(tmp_path / "ckpt"), "--ckpt-every", "3")
    first = await launch(
        tmp_path, attempt=0, procs=2, args=(*ckpt, "--steps", "200", "--sleep", "0.1")
    )
    await wait_for(tmp_path / "attempt0.out", r"step=7 world_size=2 rank=1 ", first)
    assert not (await first.terminate(grace_s=10)).ok
    log0 = read(tmp_path / "attempt0.out")
    assert "step=1 world_size=2 rank=0 loss=" in log0
    assert "restart=0" in log0

    second = await launch(tmp_path, attempt=1, procs=1, args=(*ckpt, "--steps", "12"))
    status = await asyncio.wait_for(second.wait(), timeout=120)
    log1 = read(tmp_path / "attempt1.out")
    assert status.ok, read(tmp_path / "attempt1.err")
    resumed = int(re.findall(r"resumed_from=(\d+) world_size=1 rank=0", log1)[0])
    assert resumed >= 6 and resumed % 3 == 0
    steps = [
        int(s) for s in re.findall(r"step=(\d+) world_size=1 rank=0 loss=[\d.]+ restart=1", log1)
    ]
    assert steps == list(range(resumed + 1, 13))
