"""Table tests of the worker command line (services/launcher/torchrun.py)."""

from __future__ import annotations

from typing import Any

import pytest

from services.launcher.env import place_worker
from services.launcher.torchrun import worker_argv
from shared.jobspec import JobSpec

PY = "/opt/venv/bin/python"
RDZV = [
    "--rdzv-backend=c10d", "--rdzv-endpoint=node01:29400", "--rdzv-id=42-3-2",
]  # fmt: skip


def argv(
    node: str = "node01", nodes: tuple[str, ...] = ("node01", "node02"), **kw: Any
) -> list[str]:
    s = JobSpec(**({"user": "alice", "script": "train.py", "args": ("--lr", "3e-4")} | kw))
    p = place_worker(
        s, job_id=42, attempt=3, generation=2, node=node, nodelist=nodes, gpus=(0, 1),
        master_port=29400,
    )  # fmt: skip
    return worker_argv(s, p, PY)


CASES = {
    "rank 0 of a fixed-size GPU job hosts the rendezvous, one process per GPU": (
        argv(torchrun=True, gpus_per_node=8),
        [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", *RDZV,
         "--rdzv-conf=is_host=true", "--local-addr={node_address}",
         "--max-restarts=0", "train.py", "--lr", "3e-4"],
    ),
    "another node only joins it": (
        argv(node="node02", torchrun=True, gpus_per_node=8),
        [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=8", *RDZV,
         "--rdzv-conf=is_host=false", "--local-addr={node_address}",
         "--max-restarts=0", "train.py", "--lr", "3e-4"],
    ),
    "an elastic job rendezvouses at exactly the size of this attempt": (
        argv(nodes=("node01", "node02", "node03"), torchrun=True, gpus_per_node=4,
             nodes_min=2, nodes_max=4, elastic=True),
        [PY, "-m", "torch.distributed.run", "--nnodes=3", "--nproc-per-node=4", *RDZV,
         "--rdzv-conf=is_host=true", "--local-addr={node_address}",
         "--max-restarts=0", "train.py", "--lr", "3e-4"],
    ),
    "a CPU-only torchrun job runs ntasks_per_node processes": (
        argv(torchrun=True, ntasks_per_node=2),
        [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2", *RDZV,
         "--rdzv-conf=is_host=true", "--local-addr={node_address}",
         "--max-restarts=0", "train.py", "--lr", "3e-4"],
    ),
    "a non-Python program runs under torchrun without python": (
        argv(torchrun=True, script="./run.sh", args=()),
        [PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", *RDZV,
         "--rdzv-conf=is_host=true", "--local-addr={node_address}",
         "--max-restarts=0", "--no-python", "./run.sh"],
    ),
    "once per node, a Python script runs under the launcher's python": (
        argv(),
        [PY, "train.py", "--lr", "3e-4"],
    ),
    "Ray: node rank 0 is the head, its GCS on the rendezvous port, the script the driver": (
        argv(ray=True, gpus_per_node=2, cpus_per_task=4, mem_mib=4096),
        [PY, "-m", "services.launcher.raynode", "head", "--head=node01:29400",
         "--address={node_address}", "--nodes=2", "--gpus=2", "--cpus=4",
         "--object-store-mib=409", "--temp-dir=/tmp/muster-ray/42-3-2", "--",
         PY, "train.py", "--lr", "3e-4"],
    ),
    "Ray: another node runs a raylet joined to the head; no --mem, a small store": (
        argv(node="node02", ray=True, script="./driver.sh", args=()),
        [PY, "-m", "services.launcher.raynode", "worker", "--head=node01:29400",
         "--address={node_address}", "--nodes=2", "--gpus=0", "--cpus=1",
         "--object-store-mib=512", "--temp-dir=/tmp/muster-ray/42-3-2", "--",
         "./driver.sh"],
    ),
    "once per node, a batch script is executed through its #! line": (
        argv(script="/home/alice/job.sh", args=("a b",)),
        ["/home/alice/job.sh", "a b"],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("got", "want"), CASES.values(), ids=CASES.keys())
def test_worker_argv(got: list[str], want: list[str]) -> None:
    assert got == want
