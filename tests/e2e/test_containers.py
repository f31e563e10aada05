"""End to end with a real container runtime (podman) on a local cluster: a job with
pyxis's `--container-image`, `--container-mounts` and `--container-workdir` runs its
script inside the image, as its user, with the job's environment, its GPUs and its
mounts. The image is built here from a static busybox (no registry is reachable)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from shared.states import TERMINAL
from tests.support.cluster import eventually, job_state, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

BUSYBOX = Path("/bin/busybox")
if not shutil.which("podman") or not BUSYBOX.exists():
    pytest.skip(
        "needs podman and busybox-static (scripts/test installs both with apt-get)",
        allow_module_level=True,
    )

SCRIPT = """#!/bin/sh
cat /etc/muster-image
echo "uid=$(id -u) job=$SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES pwd=$(pwd)"
echo written-inside > /data/out.txt
"""


@pytest.fixture
def image(tmp_path: Path) -> Iterator[str]:
    """A one-binary image: busybox, its applets, and a marker file."""
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "data").mkdir()
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in ("sh", "cat", "echo", "id", "pwd", "sleep"):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "muster-image").write_text("inside the muster test image\n")
    tar = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    name = f"localhost/muster-test-{uuid.uuid4().hex[:8]}:1"
    subprocess.run(["podman", "import", str(tar), name], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["podman", "rmi", "-f", name], check=False, capture_output=True)


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(1)) as c:
        yield c


async def test_a_job_runs_in_its_container_with_its_environment_gpus_and_mounts(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path, image: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    features = await db.fetchval("SELECT features FROM nodes WHERE name = 'node01'")
    assert "container" in features  # the agent found podman
    argv = (
        f"--container-image={image}",
        f"--container-mounts={data}:/data",
        "--container-workdir=/data",
        "--gpus-per-node=2",
    )
    reply = await submit(cluster.nats_url, SCRIPT, argv, workdir=str(tmp_path))
    job_id = reply.job_ids[0]
    final = await eventually(
        lambda: job_state(db, job_id), lambda s: s in {str(t) for t in TERMINAL}, 120, "ended"
    )
    out = (tmp_path / f"slurm-{job_id}.out").read_text()
    assert final == "COMPLETED", out
    assert "inside the muster test image" in out
    assert f"uid=0 job={job_id} gpus=0,1 pwd=/data" in out, out
    assert (data / "out.txt").read_text() == "written-inside\n"
    left = await asyncio.to_thread(
        subprocess.run,
        ["podman", "ps", "-a", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    )
    assert f"muster-{job_id}-" not in left.stdout  # --rm: the container is gone
