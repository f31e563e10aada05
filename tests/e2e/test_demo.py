"""End to end: the main job (`./scripts/demo`, `muster demo`) as README gives it, in a
state folder of its own: the cluster starts, the workload completes with the elastic
job shrunk after its injected XID 79, the operator's resume brings the node back, the
cluster's GPU time is reported, and the cluster stops with no process left. Run twice
on the same state, as README says it can be."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.e2e.test_supervision import cli, processes_of

pytestmark = pytest.mark.slow


async def test_the_demo_runs_to_its_end_twice_on_the_same_state() -> None:
    # Not under pytest's own temporary root (test_supervision's `up` says why).
    root = Path(tempfile.mkdtemp(prefix="muster-demo-"))
    state = root / "state"
    state.mkdir()
    try:
        for run in (1, 2):
            done = await asyncio.to_thread(cli, state, "demo", timeout=300)
            said = done.stdout + done.stderr
            assert done.returncode == 0, f"run {run}:\n{said}"
            assert "injected XID 79 on node" in done.stdout and " restarted on " in done.stdout
            assert "resumed by the operator (GPU 0 replaced): UP" in done.stdout
            assert "Cluster utilization " in done.stdout and "GPU-minutes" in done.stdout
            assert done.stdout.rstrip().endswith("cluster down")
            assert await asyncio.to_thread(processes_of, state) == [], f"run {run} left these"
    finally:
        if (state / "cluster.json").exists():
            await asyncio.to_thread(cli, state, "down")
        shutil.rmtree(root, ignore_errors=True)
