"""A real PyTorch job (CPU, gloo) under `--torchrun --nodes 2:3` on three simulated
nodes: an XID 79 mid-run shrinks it to two nodes, it resumes from its checkpoint and
finishes. The assertions read the job's own log."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import (
    eventually,
    inject,
    job_state,
    nodes,
    running_cluster,
    submit,
)

torch = pytest.importorskip("torch", reason="scripts/test installs torch==2.13.0 (CPU)")
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_elastic.py"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(3, gpus=1)
    ) as c:
        yield c


async def test_xid_79_shrinks_a_torch_job_which_resumes_from_its_checkpoint(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    argv = ("--torchrun", "--nodes=2:3", "--gpus-per-node=1", "--time=10", "--job-name=train")
    args = ("--steps", "40", "--ckpt-every", "5", "--ckpt-dir", str(ckpt), "--sleep", "0.25")
    reply = await submit(
        cluster.nats_url,
        EXAMPLE.read_text(),
        argv,
        workdir=str(tmp_path),
        args=args,
        script_path=str(EXAMPLE),
    )
    job_id = reply.job_ids[0]
    log = tmp_path / f"slurm-{job_id}.out"

    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
    await eventually(
        lambda: asyncio.to_thread(_read, log), lambda t: "step=12 world_size=3" in t, 120, "step 12"
    )
    victim = (await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id))[-1]
    await inject(cluster.nats_url, victim, 79)

    await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 180, "completed")
    text = log.read_text()
    steps3 = [int(m) for m in re.findall(r"step=(\d+) world_size=3 rank=0", text)]
    steps2 = [int(m) for m in re.findall(r"step=(\d+) world_size=2 rank=0", text)]
    assert steps3 and steps2, text[-2000:]
    resumed = [int(m) for m in re.findall(r"resumed_from=(\d+)", text)]
    assert resumed and resumed[-1] > 0  # continued from a checkpoint, not from step 0
    assert min(steps2) == resumed[-1] + 1
    assert max(steps2) == 40
    assert min(steps2) > 5  # training continued at world size 2 without starting over


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
