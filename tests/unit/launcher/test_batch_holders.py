"""`--batch-nodes=first`: what each node's agent is asked to start (gang.worker_spec)."""

from __future__ import annotations

from services.launcher.gang import HOLDER_ARGV, Generation, worker_spec
from shared.jobspec import JobSpec

GEN = Generation(
    job_id=12, attempt=0, generation=1, nodes=("n2", "n1"), gpus={"n2": [0], "n1": [3]}
)


def job(first: bool) -> JobSpec:
    return JobSpec(
        user="alice", script="#!/bin/sh\nsrun hostname\n", script_name="run.sh",
        nodes_min=2, nodes_max=2, gpus_per_node=1, workdir="/home/alice",
        batch_first_node=first,
    )  # fmt: skip


def test_the_first_node_runs_the_script_and_the_others_hold_the_allocation() -> None:
    first, other = (worker_spec(job(True), GEN, n, "n2", 29500) for n in GEN.nodes)
    assert first.argv[-1].endswith("/run.sh")
    assert first.stdout == "slurm-12.out"
    assert other.argv == HOLDER_ARGV
    assert (other.stdout, other.stderr) == ("/dev/null", "/dev/null")
    # the holder keeps the node's share of the job: its GPUs, for the steps run there
    assert other.limits is not None
    assert (other.limits.gpus, other.env["CUDA_VISIBLE_DEVICES"]) == ((3,), "3")


def test_every_node_runs_the_script_by_default() -> None:
    specs = [worker_spec(job(False), GEN, n, "n2", 29500) for n in GEN.nodes]
    assert [s.argv[-1].endswith("/run.sh") for s in specs] == [True, True]
    assert [s.stdout for s in specs] == ["slurm-12.out", "slurm-12.out"]
