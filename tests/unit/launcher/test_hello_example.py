"""examples/hello.sh, a #SBATCH script, run once on a node the way the launcher runs it:
`build_env` for the environment, `worker_argv` for the command, `spawn_worker` for the
process."""

from __future__ import annotations

import sys
from pathlib import Path

from services.launcher.env import build_env, place_worker
from services.launcher.executor import spawn_worker
from services.launcher.torchrun import worker_argv
from shared.jobspec import JobSpec

HELLO = str(Path(__file__).resolve().parents[3] / "examples" / "hello.sh")


async def test_hello_prints_what_a_batch_script_sees_on_its_node(tmp_path: Path) -> None:
    spec = JobSpec(
        user="alice", name="hello", script=HELLO, workdir=str(tmp_path), gpus_per_node=2,
        nodes_min=3, nodes_max=3, export="PATH",
    )  # fmt: skip
    placement = place_worker(
        spec, job_id=12, attempt=1, generation=0, node="gpu02",
        nodelist=["gpu01", "gpu02", "gpu03"], gpus=[5, 4], master_port=29500,
    )  # fmt: skip
    env = build_env(spec, placement, {"PATH": "/usr/bin:/bin", "HOME": "/root"})
    worker = await spawn_worker(
        worker_argv(spec, placement, sys.executable), env, spec.workdir, "hello.out",
        "hello.out", allow_root=True,
    )  # fmt: skip
    assert (await worker.wait()).ok
    lines = (tmp_path / "hello.out").read_text().splitlines()
    assert lines[1:5] == [
        "job 12 'hello' node 1 of 3 (gpu[01-03])",
        "rank 1 of 3, master gpu01:29500",
        "gpus on node: 2 (CUDA_VISIBLE_DEVICES='4,5')",
        f"restart count: 0, workdir: {tmp_path}",
    ]
    assert "SLURM_JOB_NODELIST=gpu[01-03]" in lines
