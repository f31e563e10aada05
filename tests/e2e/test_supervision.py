"""End to end: `muster up` supervises what it starts and `muster down` stops all of it.

The real CLI runs in a temporary state folder with its own NATS and PostgreSQL; a
service and a node agent are killed with SIGKILL and come back under new pids (read
from cluster.json, as an operator would), a job still runs, and after `muster down`
no process of the cluster is left and no log holds a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.support.cluster import FAST, REPO, eventually

pytestmark = pytest.mark.slow

TOPOLOGY = """\
gpus_per_node = 2
[[leaf]]
name = "leaf1"
nodes = ["node01", "node02"]  # names the default cluster.toml partitions know
"""


def cli(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`muster ARGS` with its own servers: no MUSTER_* URL of the test session leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(FAST, PYTHONPATH=str(REPO), MUSTER_STATE_DIR=str(state))
    return subprocess.run(
        [sys.executable, "-m", "muster.cli", "--state", str(state), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(state.parent),
    )


def submitted(state: Path, *options: str) -> int:
    """`muster submit OPTIONS` as you, signed with the key `muster up` gave you."""
    done = cli(state, "submit", f"--chdir={state}", *options, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return int(done.stdout.split()[-1])


def pids(state: Path) -> dict[str, int]:
    found: dict[str, int] = json.loads((state / "cluster.json").read_text())["pids"]
    return found


def processes_of(state: Path) -> list[str]:
    """Every live process that names the state folder in its command line or its
    environment (servers, services, agents, the supervisor, job workers)."""
    mark = str(state).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if (proc / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie runs nothing; its parent reaps it
            cmdline = (proc / "cmdline").read_bytes()
            if mark in cmdline or mark in (proc / "environ").read_bytes():
                words = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name}: {words[:120]}")
    return found


@pytest.fixture
def up() -> Iterator[Path]:
    # Not under pytest's own temporary root: a pytest session that starts meanwhile
    # makes that 0700 again, and PostgreSQL runs as its own user (when we are root).
    root = Path(tempfile.mkdtemp(prefix="muster-up-"))
    state = root / "state"
    state.mkdir()
    topology = root / "topology.toml"
    topology.write_text(TOPOLOGY)
    started = cli(state, "up", "--topology", str(topology), "--wait", "90")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        yield state
    finally:
        if (state / "cluster.json").exists():
            cli(state, "down")
        shutil.rmtree(root, ignore_errors=True)


async def test_killed_processes_come_back_and_down_leaves_nothing(up: Path) -> None:
    state = up
    before = pids(state)
    assert {"supervisor", "server-nats", "server-postgres", "placer", "node-node01"} <= set(before)
    data = json.loads((state / "cluster.json").read_text())
    agent_log = state / "logs" / "node-node01.log"
    registered = agent_log.read_text().count("registered node=node01")

    for key in ("placer", "node-node01"):
        os.kill(before[key], signal.SIGKILL)
    after = await eventually(
        lambda: asyncio.to_thread(pids, state),
        lambda p: p["placer"] != before["placer"] and p["node-node01"] != before["node-node01"],
        what="new pids for the killed placer and node agent",
    )
    for key in ("placer", "node-node01"):
        os.kill(after[key], 0)  # alive
    assert {k: v for k, v in after.items() if k not in ("placer", "node-node01")} == {
        k: v for k, v in before.items() if k not in ("placer", "node-node01")
    }

    # The new agent answers before its probe registers the node (muster/node.py): until
    # then a job's start finds no agent on node01, and the job is requeued without it.
    await eventually(
        lambda: asyncio.to_thread(agent_log.read_text),
        lambda text: text.count("registered node=node01") > registered,
        timeout=60,
        what="the restarted agent registered its node",
    )
    db = await asyncpg.connect(data["database_url"])
    try:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM nodes WHERE state = 'UP'"),
            lambda n: n == 2,
            what="both nodes UP again",
        )
        job_id = await asyncio.to_thread(submitted, state, "--nodes=2", "--wrap", "echo hi")
        await eventually(
            lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job_id),
            lambda s: s == "COMPLETED",
            timeout=60,
            what="a job on both nodes",
        )
        # A job left running when the cluster goes down: `down` stops its workers too.
        marks = state / "worker.pids"
        sleeper = f"echo $$ >> {marks}; exec sleep 300"
        await asyncio.to_thread(submitted, state, "--nodes=2", "--wrap", sleeper)
        workers = await eventually(
            lambda: asyncio.to_thread(lambda: marks.read_text().split() if marks.exists() else []),
            lambda found: len(found) == 2,
            timeout=60,
            what="both workers of a long job running",
        )
    finally:
        await db.close()

    stopped = cli(state, "down")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "Traceback" not in stopped.stdout + stopped.stderr
    left = await eventually(
        lambda: asyncio.to_thread(processes_of, state), lambda p: not p, 10, "nothing left"
    )
    assert left == []
    for pid in map(int, workers):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the long job's workers are gone with the cluster
    for log in sorted((state / "logs").glob("*.log")):
        assert "Traceback" not in log.read_text(), log.name
