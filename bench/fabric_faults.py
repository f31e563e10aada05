"""Fabric fault latency: a node's fabric link (a real veth link, `fab0`, in the node's
own network namespace, as in tests/e2e/test_fabric.py) set down under a running elastic
job, until (1) the `node.fault` naming the link reaches a consumer on the bus, and (2)
the job's workers run again on the surviving nodes.

The clock starts just before `ip link set fab0 down`; (1) stops when a subscriber on
`muster.node.fault` receives the fault, (2) at the new generation's `segment_start`
(written once every surviving agent has a started worker). The floor is the damping
grace (MUSTER_FABRIC_DOWN_GRACE_S, `--grace`): a shorter bounce is no fault by design.
Between runs the job is cancelled, the link set up, the node returns by itself after
the stable period (`--stable`), and an operator resume clears its flap history (one
fault per run would otherwise hold it as flapping by the third). Needs root and
iproute2. Prints percentiles, then one JSON object.

    .venv/bin/python bench/fabric_faults.py [--runs 10] [--grace 0.5] [--stable 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import nats
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import FAST, latency_figures, poll_run, provision_identity, wait_for_nodes
from muster.client import call
from muster.cluster import Cluster, NodeDef
from shared import embedded
from shared.api import JobSelector, NodeAction, Ok, SubmitReply, SubmitRequest
from shared.events import NodeFault, decode
from tests.support import netns

LINK = "fab0"
NODES = 3
SCRIPT = "#!/bin/bash\nsleep 600\n"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def add_link(namespace: str) -> None:
    ip("-n", namespace, "link", "add", LINK, "type", "veth", "peer", "name", f"{LINK}p")
    ip("-n", namespace, "link", "set", f"{LINK}p", "up")
    ip("-n", namespace, "link", "set", LINK, "up")


async def one_run(
    url: str, db: asyncpg.Connection, bed: netns.TestBed, faults: asyncio.Queue[tuple[float, str]]
) -> tuple[float, float]:
    req = SubmitRequest(user="root", script=SCRIPT, argv=("--nodes=2:3", "--gpus-per-node=1"))
    job_id = (await call(url, "submit", req, SubmitReply)).job_ids[0]
    row = await poll_run(db, job_id, lambda r: r["state"] == "RUNNING" and len(r["nodes"]) == 3)
    victim = row["nodes"][0]
    while not faults.empty():
        faults.get_nowait()
    t0 = time.time()
    await asyncio.to_thread(ip, "-n", bed.hosts[victim].namespace, "link", "set", LINK, "down")
    while True:
        at, node = await asyncio.wait_for(faults.get(), timeout=60)
        if node == victim:
            break
    row = await poll_run(db, job_id, lambda r: r["restart_count"] == 1 and r["state"] == "RUNNING")
    restarted = float(row["seg"]) - t0
    await call(url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)
    await poll_run(db, job_id, lambda r: r["state"] == "CANCELLED")
    await asyncio.to_thread(ip, "-n", bed.hosts[victim].namespace, "link", "set", LINK, "up")
    await wait_for_nodes(db, NODES)
    # Every run is a failure in the node's flap history: forget it, as an operator would.
    await call(url, "resume", NodeAction(user="root", node=victim, reason="bench"), Ok)
    return at - t0, restarted


async def measure(
    url: str, db_url: str, bed: netns.TestBed, runs: int
) -> tuple[list[float], list[float]]:
    db = await asyncpg.connect(db_url)
    nc = await nats.connect(url)
    faults: asyncio.Queue[tuple[float, str]] = asyncio.Queue()

    async def on_fault(msg: Msg) -> None:
        event = decode(msg.data)
        if isinstance(event, NodeFault) and event.link:
            faults.put_nowait((time.time(), event.node))

    await nc.subscribe("muster.node.fault", cb=on_fault)
    try:
        await wait_for_nodes(db, NODES)
        pairs = [await one_run(url, db, bed, faults) for _ in range(runs)]
    finally:
        await nc.close()
        await db.close()
    return [p[0] for p in pairs], [p[1] for p in pairs]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--stable", type=float, default=1.0)
    args = parser.parse_args()
    why = netns.available()
    if why:
        raise SystemExit(f"fabric_faults needs network namespaces: {why}")
    fabric = {
        "MUSTER_FABRIC": LINK,
        "MUSTER_FABRIC_DOWN_GRACE_S": str(args.grace),
        "MUSTER_FABRIC_STABLE_S": str(args.stable),
        "MUSTER_FABRIC_FLAP_WINDOW_S": "1",  # each run's one link-down is not a flap
    }
    os.environ.update(FAST)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bed = netns.TestBed()
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        try:
            hosts = bed.create([f"node{i + 1:02d}" for i in range(NODES)])
            for host in hosts.values():
                add_link(host.namespace)
            server = embedded.start_nats(state / "nats", host=bed.control_address)
            pg = embedded.start_postgres(state, fast=True)
            try:
                provision_identity(state)
                db_url = embedded.create_database(pg.url, "muster")
                cluster = Cluster(state, server.url, db_url)
                cluster.start_services()
                for i, (name, host) in enumerate(hosts.items()):
                    node = NodeDef(name, 1, "SIM-H100", ("spine0", f"leaf{i % 2 + 1}"))
                    env = {"MUSTER_NODE_ADDRESS": host.address, **fabric}
                    cluster.start_node(node, prefix=host.exec_prefix(), **env)
                try:
                    fault, restart = asyncio.run(measure(server.url, db_url, bed, args.runs))
                finally:
                    cluster.stop_all()
            finally:
                server.stop()
                pg.stop()
        finally:
            bed.destroy()
    f = latency_figures("fabric_fault_consumed", fault)
    r = latency_figures("fabric_fault_to_restart", restart)
    print(f"link down -> node.fault consumed: p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms")
    print(f"link down -> workers running again: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms")
    result = {
        "bench": "fabric_faults",
        "samples": len(fault),
        "grace_s": args.grace,
        "fault_p50_ms": f["p50_ms"],
        "fault_p99_ms": f["p99_ms"],
        "fault_max_ms": f["max_ms"],
        "restart_p50_ms": r["p50_ms"],
        "restart_p99_ms": r["p99_ms"],
        "restart_max_ms": r["max_ms"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
