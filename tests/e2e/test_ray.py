"""End to end with the real `ray` package (CPU): `muster submit --ray` starts a Ray
cluster on the allocation — a head on the first node, raylets on the others — runs the
script as its driver, and leaves no Ray process behind; a GPU fault on a node ends that
Ray cluster and the job starts a new one on a spare."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from shared.states import TERMINAL
from tests.support.cluster import eventually, inject, job_state, nodes, running_cluster, submit

pytest.importorskip("ray", reason="the ray extra (installed with dev)")
pytestmark = pytest.mark.slow

DRIVER = Path(__file__).resolve().parents[2] / "examples" / "ray_driver.py"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(3, gpus=1)
    ) as c:
        yield c


def ray_processes(job_id: int) -> list[str]:
    """Command lines on this machine of the job's Ray processes and node wrappers."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"muster-ray/{job_id}-" in cmd or "services.launcher.raynode" in cmd:
            found.append(cmd)
    return found


async def ran(db: asyncpg.Connection, cluster: Cluster, tmp_path: Path, *extra: str) -> int:
    reply = await submit(
        cluster.nats_url,
        DRIVER.read_text(),
        ("--ray", "-N", "2", "--gpus-per-node=1", "--cpus-per-task=2", "--time=10"),
        workdir=str(tmp_path),
        script_path=str(DRIVER),
        args=extra,
    )
    return reply.job_ids[0]


async def ended(db: asyncpg.Connection, job_id: int, timeout: float) -> str | None:
    final = {str(s) for s in TERMINAL}
    return await eventually(lambda: job_state(db, job_id), lambda s: s in final, timeout, "ended")


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def test_a_ray_job_sees_every_node_of_its_allocation_and_leaves_nothing_behind(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await ran(db, cluster, tmp_path)
    assert await ended(db, job_id, 180) == "COMPLETED", read(tmp_path / f"slurm-{job_id}.out")
    out = read(tmp_path / f"slurm-{job_id}.out")
    assert "attempt=0 nodes=2 tasks_on=2 gpus=2" in out, out[-3000:]
    await eventually(lambda: asyncio.to_thread(ray_processes, job_id), lambda p: not p, 30, "gone")


async def test_a_fault_on_a_ray_node_moves_the_job_to_a_spare_with_a_new_ray_cluster(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id = await ran(db, cluster, tmp_path, "300")
    log = tmp_path / f"slurm-{job_id}.out"
    await eventually(
        lambda: asyncio.to_thread(read, log), lambda t: "attempt=0 nodes=2" in t, 180, "driver"
    )
    first: list[str] = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    victim = first[1]  # a raylet's node, not the head's
    await inject(cluster.nats_url, victim, 79)

    assert await ended(db, job_id, 240) == "COMPLETED", read(log)[-3000:]
    text = read(log)
    assert re.search(r"attempt=[1-9] nodes=2 tasks_on=2 gpus=2", text), text[-3000:]
    last: list[str] = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    assert victim not in last
    await eventually(lambda: asyncio.to_thread(ray_processes, job_id), lambda p: not p, 30, "gone")
