"""End to end: the cluster's GPU time by state (`muster report --cluster`, sreport's
`cluster Utilization`). The health monitor counts every GPU's time each liveness pass;
while a two-GPU job runs and an operator has drained the other node, the report says
GPU time was allocated, idle and planned down, and the whole counted is what the
cluster's GPUs had since the monitor began: checked against the wall clock, not a
stub's figures; by job size, the job's allocation is the allocated time. The sreport
shim prints the same numbers in Slurm's layout."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from shared.api import NodeAction, Ok
from shared.states import TERMINAL
from tests.support.cluster import eventually, nodes, run_cli, running_cluster, submit

pytestmark = pytest.mark.slow

GPUS = 2 * 4  # nodes(2): four GPUs each
# A liveness pass counts the time since the one before: at either end of a measurement
# one pass's worth (a second; longer on a loaded machine) falls on the other side.
EDGE_S = 4.0


async def test_the_cluster_report_counts_allocated_idle_and_planned_down_gpu_time(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(2)) as c:
        counted = "SELECT coalesce(sum(gpu_seconds), 0) FROM cluster_hours"
        began, before = time.time(), await db.fetchval(counted)
        env = {"MUSTER_NATS_URL": c.nats_url}
        await call(c.nats_url, "drain", NodeAction(user="root", node="node02", reason="bios"), Ok)
        job = (
            await submit(
                c.nats_url, "#!/bin/bash\nsleep 4\n", ("--gpus-per-node=2", "-w", "node01")
            )
        ).job_ids[0]
        ended = "SELECT state FROM job_runs WHERE job_id = $1 AND state = ANY($2::text[])"
        state = await eventually(
            lambda: db.fetchval(ended, job, sorted(TERMINAL)), lambda s: s is not None, 60.0
        )
        assert state == "COMPLETED"
        since = str(int(began // 3600 * 3600))  # the hour the test began in
        out = run_cli("report", "--cluster", "-S", since, "--json", env=env)
        elapsed = time.time() - began
        assert out.returncode == 0, out.stderr
        usage = json.loads(out.stdout)["usage"]
        after, dt = await db.fetchval(counted), time.time() - began
        # two GPUs for the job's 4 s, and its start and stop
        assert 2 * 3 <= usage["allocated_s"] <= 2 * (4 + 2 * EDGE_S + 10), usage
        # node02's four GPUs, drained by an operator, for most of the test
        assert 4 * 2 <= usage["planned_down_s"] <= 4 * (elapsed + EDGE_S), usage
        assert usage["idle_s"] > 0, usage  # node01's other two, and all four before
        # every GPU's every second counted once: over the test, the cluster's GPUs times
        # the wall clock, give or take the passes at its two ends
        counted = after - before
        assert GPUS * (dt - EDGE_S) <= counted <= GPUS * (dt + EDGE_S), (counted, dt)
        total = sum(usage.values())
        assert total >= counted - GPUS * EDGE_S  # the report reads what was counted

        # by job size: the one two-GPU job's allocation, what the monitor saw it hold
        sized = run_cli("report", "--sizes", "-S", since, "--json", env=env)
        assert sized.returncode == 0, sized.stderr
        (row,) = json.loads(sized.stdout)["rows"]
        assert row["jobs"] == [1, 0, 0, 0] and row["share"] == 1.0, row
        small = row["gpu_seconds"][0]
        assert abs(small - usage["allocated_s"]) <= 2 * EDGE_S, (small, usage)

        table = run_cli("report", "--cluster", "-S", since, "-t", "seconds", env=env)
        assert table.returncode == 0, table.stderr
        assert table.stdout.startswith("Cluster utilization ")
        assert "Planned down" in table.stdout.splitlines()[1]

        wrote = run_cli("shims", str(tmp_path / "bin"), env={})
        assert wrote.returncode == 0, wrote.stderr
        sreport = await asyncio.to_thread(
            subprocess.run,
            [str(tmp_path / "bin" / "sreport"), "-P", "-n", "-t", "seconds", "cluster",
             "Utilization", f"start={since}"],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )  # fmt: skip
        assert sreport.returncode == 0, sreport.stderr
        cluster, allocated, _down, planned, _idle, reported = sreport.stdout.strip().split("|")
        assert int(allocated) == round(usage["allocated_s"])  # no job since: the same
        assert int(planned) >= round(usage["planned_down_s"])  # still drained: more
        assert int(reported) >= round(total)
        assert cluster

        sizes = await asyncio.to_thread(
            subprocess.run,
            [str(tmp_path / "bin" / "sreport"), "-P", "-n", "-t", "seconds", "job",
             "SizesByAccount", f"start={since}", "printjobcount"],
            capture_output=True, text=True, timeout=60, env={**os.environ, **env},
        )  # fmt: skip
        assert sizes.returncode == 0, sizes.stderr
        assert sizes.stdout.strip().split("|")[2:] == ["1", "0", "0", "0", "100.00%"]
