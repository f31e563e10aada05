"""Node agent faults on a local cluster of two nodes.

- Killed: a running job's node agent is SIGKILLed and started again; the job must not
  notice (its restarts are counted: must be 0), as its worker runs under its own stepd.
- Hung: the agent is SIGSTOPped until the job runs on the other node. The clock starts
  at the SIGSTOP and stops at the new attempt's `segment_start` (its workers started);
  the overlap is how long the old attempt's processes (watched in /proc every 10 ms)
  outlived that moment (must be 0: the old worker fenced itself first). Then SIGCONT,
  and the next run waits until both nodes are UP again.

Short timings (MUSTER_HEARTBEAT_TIMEOUT_S, MUSTER_FENCE_S, MUSTER_DOWN_AFTER_S below) keep
a run to seconds. Prints a summary, then one JSON object.

    .venv/bin/python bench/agent_faults.py [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import latency_figures, local_cluster, percentile, wait_for_nodes
from muster.client import call
from muster.cluster import Cluster, NodeDef
from services.launcher.executor import group_members
from services.launcher.worker_table import ProcessRef, WorkerTable, alive, node_state_folder
from shared.api import JobSelector, NodeAction, Ok, SubmitReply, SubmitRequest

ENV = {
    "MUSTER_HEARTBEAT_TIMEOUT_S": "2",
    "MUSTER_FENCE_S": "4",
    "MUSTER_DOWN_AFTER_S": "7",
    "MUSTER_FAULT_KILL_WAIT_S": "1",
    "MUSTER_KILL_WAIT_S": "2",  # the job ignores SIGTERM: cancelling it between runs
}
SCRIPT = "#!/bin/bash\ntrap '' TERM\nsleep 600 &\nwhile true; do sleep 0.1; done\n"


async def row_of(db: asyncpg.Connection, job_id: int) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT state, nodes, attempt, restart_count,"
        " extract(epoch FROM segment_start)::float8 AS seg FROM job_runs WHERE job_id = $1",
        job_id,
    )


async def until(db: asyncpg.Connection, job_id: int, ok, timeout: float = 90):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await row_of(db, job_id)
        if row is not None and ok(row):
            return row
        await asyncio.sleep(0.01)
    raise SystemExit(f"job {job_id} did not get there")


async def start_job(
    c: Cluster, db: asyncpg.Connection
) -> tuple[int, asyncpg.Record, list[int], ProcessRef]:
    req = SubmitRequest(user="root", script=SCRIPT, argv=("--nodes=1", "--gpus-per-node=4"))
    job_id = (await call(c.nats_url, "submit", req, SubmitReply)).job_ids[0]
    row = await until(db, job_id, lambda r: r["state"] == "RUNNING")
    table = WorkerTable(node_state_folder(c.state_dir, row["nodes"][0]))
    while True:  # the worker's group, from the agent's own table and /proc
        found = [table.with_pids(r) for r in table.records() if r.job_id == job_id]
        if found and found[0].worker is not None:
            group = group_members(found[0].worker.pid)
            if len(group) >= 2:
                return job_id, row, group, found[0].worker
        await asyncio.sleep(0.02)


async def stop_job(c: Cluster, db: asyncpg.Connection, job_id: int) -> None:
    await call(c.nats_url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)
    await until(db, job_id, lambda r: r["state"] == "CANCELLED")
    await wait_for_nodes(db, 2)


def node_def(name: str) -> NodeDef:
    index = int(name.removeprefix("node"))
    return NodeDef(name, 4, "SIM-H100", ("spine0", f"leaf{(index - 1) % 2 + 1}"))


async def killed_run(c: Cluster, db: asyncpg.Connection) -> tuple[int, bool]:
    """(restarts the job suffered, whether its first worker survived) when its agent
    was SIGKILLed and started again."""
    job_id, before, _, worker = await start_job(c, db)
    node = before["nodes"][0]
    c.kill(f"node-{node}", signal.SIGKILL)
    await asyncio.to_thread(os.waitpid, c.pids[f"node-{node}"], 0)
    c.start_node(node_def(node))
    await asyncio.sleep(3.0)  # the new agent registers and re-adopts; heartbeats resume
    after = await row_of(db, job_id)
    assert after is not None
    restarts = (after["attempt"] - before["attempt"]) + (
        after["restart_count"] - before["restart_count"]
    )
    survived = after["state"] == "RUNNING" and alive(worker)  # the same process
    await stop_job(c, db, job_id)
    return restarts, survived


async def hung_run(c: Cluster, db: asyncpg.Connection) -> tuple[float, float]:
    """(seconds from SIGSTOP to the job running elsewhere, overlap seconds)."""
    job_id, before, group, _ = await start_job(c, db)
    node = before["nodes"][0]
    agent_pid = c.pids[f"node-{node}"]
    t_stop = time.time()
    os.kill(agent_pid, signal.SIGSTOP)
    old_gone = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if old_gone is None and not any(_alive(p) for p in group):
                old_gone = time.time()
            row = await row_of(db, job_id)
            if row is not None and row["state"] == "RUNNING" and node not in row["nodes"]:
                break
            await asyncio.sleep(0.01)
        else:
            raise SystemExit("the job never ran elsewhere")
        while old_gone is None:  # the old attempt outlives the move: measure how long
            if not any(_alive(p) for p in group):
                old_gone = time.time()
            await asyncio.sleep(0.01)
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    # Each hang counts as a node failure; three in an hour hold the node for an operator.
    await call(c.nats_url, "resume", NodeAction(user="root", node=node, reason="bench"), Ok)
    await stop_job(c, db, job_id)
    return row["seg"] - t_stop, max(0.0, old_gone - row["seg"])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def measure(c: Cluster, runs: int) -> dict[str, object]:
    db = await asyncpg.connect(c.database_url)
    try:
        await wait_for_nodes(db, 2)
        killed, hung = [], []
        for i in range(runs):
            killed.append(await killed_run(c, db))
            print(f"killed agent, run {i + 1}: {killed[-1]}", file=sys.stderr)
        for i in range(runs):
            hung.append(await hung_run(c, db))
            print(f"hung agent, run {i + 1}: {hung[-1]}", file=sys.stderr)
    finally:
        await db.close()
    moved = [m for m, _ in hung]
    overlaps = [o for _, o in hung]
    return latency_figures(
        "agent_faults",
        moved,
        killed_agent_runs=runs,
        killed_agent_job_restarts=sum(r for r, _ in killed),
        killed_agent_workers_survived=sum(s for _, s in killed),
        hung_to_running_elsewhere_p50_s=round(percentile(moved, 50), 2),
        hung_to_running_elsewhere_p99_s=round(percentile(moved, 99), 2),
        overlap_max_s=round(max(overlaps), 3),
        timings={k.removeprefix("MUSTER_").lower(): float(v) for k, v in ENV.items()},
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--suspect", type=float, help="MUSTER_HEARTBEAT_TIMEOUT_S")
    parser.add_argument("--fence", type=float, help="MUSTER_FENCE_S (below --down)")
    parser.add_argument("--down", type=float, help="MUSTER_DOWN_AFTER_S")
    args = parser.parse_args()
    for flag, variable in (
        ("suspect", "MUSTER_HEARTBEAT_TIMEOUT_S"),
        ("fence", "MUSTER_FENCE_S"),
        ("down", "MUSTER_DOWN_AFTER_S"),
    ):
        if getattr(args, flag) is not None:
            ENV[variable] = str(getattr(args, flag))
    with local_cluster(2, env=ENV) as cluster:
        result = asyncio.run(measure(cluster, args.runs))
    print(
        f"agent SIGKILL + restart: {result['killed_agent_job_restarts']} job restarts in"
        f" {args.runs} runs; agent hung -> job running elsewhere p50"
        f" {result['hung_to_running_elsewhere_p50_s']} s, p99"
        f" {result['hung_to_running_elsewhere_p99_s']} s, overlap max {result['overlap_max_s']} s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
