"""End to end: `scontrol requeuehold` and `muster requeue --hold`, as Slurm users type
them. A running job is stopped and put back in the queue held: squeue shows it PENDING
with Slurm's reason `JobHeldUser` (restart count 1, the same id), the database holds it
requeued and held, and `scontrol release` lets it run again."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import eventually, nodes, run_cli, running_cluster

pytestmark = pytest.mark.slow

LONG = "#!/bin/bash\n#SBATCH --job-name=held --gpus-per-node=1 --time=5\nsleep 120\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(1)) as c:
        yield c


async def test_requeuehold_puts_a_running_job_back_held_until_release(
    cluster: Cluster, tmp_path: Path, db: asyncpg.Connection
) -> None:
    wrote = run_cli("shims", str(tmp_path / "bin"), env={})
    assert wrote.returncode == 0, wrote.stderr
    (tmp_path / "long.sh").write_text(LONG)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "MUSTER_NATS_URL": cluster.nats_url,
    }

    def run(*words: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            list(words), capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
        )
        assert "Traceback" not in out.stderr, out.stderr
        return out

    async def shell(*words: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run, *words)

    async def seen(job: str) -> tuple[str, int, str]:
        out = await shell("squeue", "-j", job, "--json")
        (j,) = json.loads(out.stdout)["jobs"]
        line = await shell("squeue", "-h", "-j", job, "-o", "%R")
        return j["job_state"][0], j["restart_cnt"], line.stdout.strip()

    sub = await shell("sbatch", "--parsable", "long.sh")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    await eventually(lambda: seen(job), lambda s: s[0] == "RUNNING", 60, "the job runs")

    held = await shell("scontrol", "requeuehold", job)
    assert held.returncode == 0, held.stderr
    await eventually(
        lambda: seen(job),
        lambda s: s == ("PENDING", 1, "(JobHeldUser)"),
        60,
        "requeued and held: PENDING (JobHeldUser)",
    )
    row = await db.fetchrow(
        "SELECT r.state, j.held, j.held_by_operator FROM jobs j JOIN job_runs r USING (job_id)"
        " WHERE job_id = $1",
        int(job),
    )
    assert row is not None and tuple(row) == ("REQUEUED", True, False)
    # held: no allocation, the GPUs are free for others (the placer releases it at the
    # cycle the requeue wakes, a moment after the launcher's commit that squeue shows)
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM allocations WHERE job_id = $1 AND released_at IS NULL",
            int(job),
        ),
        lambda live: live == 0,
        30,
        "the allocation released by the placer",
    )

    released = await shell("scontrol", "release", job)
    assert released.returncode == 0, released.stderr
    await eventually(lambda: seen(job), lambda s: s[:2] == ("RUNNING", 1), 60, "released, runs")

    again = await asyncio.to_thread(
        run_cli, "requeue", "--hold", job, env={"MUSTER_NATS_URL": cluster.nats_url}
    )
    assert again.returncode == 0, again.stderr
    assert "held once requeued" in again.stdout
    await eventually(
        lambda: seen(job),
        lambda s: s == ("PENDING", 2, "(JobHeldUser)"),
        60,
        "muster requeue --hold: PENDING (JobHeldUser) again",
    )
    cancel = await shell("scancel", job)
    assert cancel.returncode == 0, cancel.stderr
