"""`muster demo`: the main job end to end on a local cluster — start it, run a small
workload, take a GPU out with an injected XID 79 under an elastic job, watch it shrink
and finish, resume the node as an operator would once its GPU is replaced (so the demo
can run again on the same state), show how the cluster's GPU time went (`muster report
--cluster`), then stop the cluster."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from muster import cluster as local
from muster.client import agent, call, current_user, register_cluster
from muster.refusal import ApiRefused
from services.fairshare.api import CLUSTER_VERB, ClusterReply, ClusterRequest
from services.fairshare.cluster_report import render_cluster
from services.fairshare.report import TimeUnit
from shared.api import (
    InjectFault,
    NodeAction,
    NodesReply,
    Ok,
    QueueReply,
    QueueRequest,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)
from shared.states import TERMINAL, JobState, NodeState

TRAIN = """#!/bin/bash
#SBATCH --job-name=train-2x2
#SBATCH --nodes=2
#SBATCH --gpus-per-node=2
#SBATCH --time=10
echo "rank $RANK of $WORLD_SIZE on $MUSTER_NODE, GPUs $CUDA_VISIBLE_DEVICES"
sleep 3
"""
ELASTIC = """#!/bin/bash
#SBATCH --job-name=elastic
#SBATCH --nodes=2:3
#SBATCH --gpus-per-node=1
echo "rank $RANK of $WORLD_SIZE on $MUSTER_NODE (restart $MUSTER_RESTART_COUNT)"
sleep 8
"""
SWEEP = """#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --gpus-per-node=1
#SBATCH --array=0-5
echo "task $SLURM_ARRAY_TASK_ID on $MUSTER_NODE"
sleep 2
"""


def run_demo(state: Path, topology: Path) -> int:
    c = local.up(state, topology)
    register_cluster(c.nats_url, c.state_dir)  # its bus credentials
    print(f"cluster up in {c.state_dir}; logs in {c.state_dir / 'logs'}")
    try:
        return asyncio.run(_workload(c.nats_url, c.state_dir / "jobs"))
    finally:
        local.down(state)
        print("cluster down")


async def _workload(url: str, workdir: Path) -> int:
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    user = current_user()
    began = time.time()
    await _nodes_up(url, 3, 60)
    ids: dict[str, int] = {}
    for name, script in (("train", TRAIN), ("elastic", ELASTIC), ("sweep", SWEEP)):
        req = SubmitRequest(
            user=user, script=script, workdir=str(workdir), script_path=f"{name}.sh",
            environment=dict(os.environ),
        )  # fmt: skip
        reply = await call(url, "submit", req, SubmitReply)
        ids[name] = reply.job_ids[0]
        print(f"submitted {name}: job {', '.join(map(str, reply.job_ids))}")
    elastic = await _until(
        lambda: _show(url, ids["elastic"]), lambda r: r.job.state == JobState.RUNNING, 30
    )
    victim = elastic.job.nodelist[0]
    t0 = time.monotonic()
    await agent(url, victim, "inject", InjectFault(gpu=0, xid=79))
    print(f"injected XID 79 on {victim} GPU 0 under job {ids['elastic']}")
    shrunk = await _until(
        lambda: _show(url, ids["elastic"]),
        lambda r: r.job.restart_count >= 1 and r.job.state == JobState.RUNNING,
        30,
    )
    print(
        f"job {ids['elastic']} restarted on {','.join(shrunk.job.nodelist)}"
        f" in {time.monotonic() - t0:.2f}s"
    )
    final = await _until(
        lambda: _queue(url), lambda q: all(j.state in TERMINAL for j in q.jobs), 120
    )
    print(f"\n{'JOBID':>6} {'NAME':<10} {'STATE':<10} {'NODES':>5} {'RESTARTS':>8}")
    for j in final.jobs:
        print(f"{j.job_id:>6} {j.name:<10} {j.state:<10} {j.nodes:>5} {j.restart_count:>8}")
    for n in (await _nodes(url)).nodes:
        print(f"  {n.name:<8} {n.state:<7} {n.reason}")
    await _resume(url, victim)
    report = await call(url, CLUSTER_VERB, ClusterRequest(user=user, since=began), ClusterReply)
    print("\n" + render_cluster(report.usage, report.since, report.until, TimeUnit.MINUTES))
    print(f"\njob output is in {workdir}")
    return 0 if all(j.state == JobState.COMPLETED for j in final.jobs) else 1


async def _nodes_up(url: str, count: int, timeout: float) -> None:
    """Wait for `count` nodes UP; else say which are not, and why (a node an earlier
    run left drained comes back with `muster resume`)."""
    try:
        await _until(lambda: _up_nodes(url), lambda n: n >= count, timeout)
    except SystemExit:
        reply = await _nodes(url)
        out = [f"{n.name} {n.state} ({n.reason})" for n in reply.nodes if n.state != NodeState.UP]
        raise SystemExit(
            f"demo: fewer than {count} nodes up after {timeout:.0f} s; not up: {'; '.join(out)}."
            " An operator brings a drained node back: muster resume NODE --reason TEXT"
        ) from None


async def _resume(url: str, node: str) -> None:
    """The operator's last step: the GPU replaced, `node` goes back into service."""
    req = NodeAction(user=current_user(), node=node, reason="demo: GPU 0 replaced")
    try:
        await call(url, "resume", req, Ok)
    except ApiRefused as err:
        print(f"{node} stays drained ({err}); an operator resumes it: muster resume {node}")
        return
    back = await _until(lambda: _node_state(url, node), lambda s: s == NodeState.UP, 30)
    print(f"  {node} resumed by the operator (GPU 0 replaced): {back}")


async def _nodes(url: str, timeout: float = 15.0) -> NodesReply:
    return await call(url, "nodes", QueueRequest(user=current_user()), NodesReply, timeout)


async def _node_state(url: str, node: str) -> str:
    return next(n.state for n in (await _nodes(url)).nodes if n.name == node)


async def _up_nodes(url: str) -> int:
    try:
        reply = await _nodes(url, 3)
    except Exception:  # services still starting
        return 0
    return sum(1 for n in reply.nodes if n.state == NodeState.UP)


async def _show(url: str, job_id: int) -> ShowJobReply:
    return await call(url, "show", ShowJobRequest(user=current_user(), job_id=job_id), ShowJobReply)


async def _queue(url: str) -> QueueReply:
    return await call(url, "queue", QueueRequest(user=current_user(), all_states=True), QueueReply)


async def _until(probe, ok, timeout: float):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: gave up waiting; last: {value!r}")
        await asyncio.sleep(0.3)
