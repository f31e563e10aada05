"""Multi-node exclusion latency: an HCA port of one node (a fake sysfs tree per agent,
MUSTER_FABRIC_ROOT, read by the same code as /sys) trained down to half its rate,
until the node's `nodes.multi_node_excluded` is set (what the placer's next cycle
reads: from then on no multi-node job gets the node), and after the rate is back, until
the flag is lifted (the stable period, `--stable`, is the floor of that one).

The clock starts just before the rate file is written; the flag is polled every 5 ms.
A fake tree has no netlink events, so the agent's poll (`--poll`) is the other floor.
`--gap` idles between a lift and the next halving: with `--gap 0` the halving's report
reaches the health consumer about 0.1 s after the lift's, and waits there for up to the
bus's 1 s fetch (a measured stall of the pull consumer, not of this path). Prints
percentiles, then one JSON object.

    .venv/bin/python bench/fabric_exclusion.py [--runs 20] [--poll 0.1] [--stable 1] [--gap 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import FAST, latency_figures, provision_identity, wait_for_nodes
from muster.cluster import Cluster, NodeDef
from shared import embedded

NODES = 2
PORT = "sys/class/infiniband/mlx5_0/ports/1"
FULL, HALF = "200 Gb/sec (4X HDR)\n", "100 Gb/sec (4X HDR)\n"


def fake_port(root: Path) -> Path:
    port = root / PORT
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text(FULL)
    return port


async def until_flag(db: asyncpg.Connection, node: str, set_: bool) -> float:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        raw = await db.fetchval("SELECT multi_node_excluded::text FROM nodes WHERE name = $1", node)
        if (raw != "{}") == set_:
            return time.time()
        await asyncio.sleep(0.005)
    raise TimeoutError(f"{node}: flag never {'set' if set_ else 'lifted'}")


async def measure(
    db_url: str, port: Path, node: str, runs: int, gap: float
) -> tuple[list[float], ...]:
    db = await asyncpg.connect(db_url)
    try:
        await wait_for_nodes(db, NODES)
        await asyncio.sleep(1.0)  # the agents' first rounds: the full rate is the norm
        flagged, lifted = [], []
        for _ in range(runs):
            await asyncio.sleep(gap)
            t0 = time.time()
            (port / "rate").write_text(HALF)
            flagged.append(await until_flag(db, node, True) - t0)
            t1 = time.time()
            (port / "rate").write_text(FULL)
            lifted.append(await until_flag(db, node, False) - t1)
    finally:
        await db.close()
    return flagged, lifted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--poll", type=float, default=0.1)
    parser.add_argument("--stable", type=float, default=1.0)
    parser.add_argument("--gap", type=float, default=2.0)
    args = parser.parse_args()
    os.environ.update(FAST)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        server = embedded.start_nats(state / "nats")
        pg = embedded.start_postgres(state, fast=True)
        try:
            provision_identity(state)
            db_url = embedded.create_database(pg.url, "muster")
            cluster = Cluster(state, server.url, db_url)
            cluster.start_services()
            ports = {}
            for i in range(NODES):
                name = f"node{i + 1:02d}"
                ports[name] = fake_port(state / "sysfs" / name)
                env = {
                    "MUSTER_FABRIC": "mlx5_0",
                    "MUSTER_FABRIC_ROOT": str(state / "sysfs" / name),
                    "MUSTER_FABRIC_POLL_S": str(args.poll),
                    "MUSTER_FABRIC_STABLE_S": str(args.stable),
                }
                cluster.start_node(NodeDef(name, 1, "SIM-H100", ("spine0", "leaf1")), **env)
            try:
                flagged, lifted = asyncio.run(
                    measure(db_url, ports["node01"], "node01", args.runs, args.gap)
                )
            finally:
                cluster.stop_all()
        finally:
            server.stop()
            pg.stop()
    f = latency_figures("fabric_exclusion_set", flagged)
    c = latency_figures("fabric_exclusion_lifted", lifted)
    print(f"rate halved -> multi-node excluded: p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms")
    print(f"rate back -> exclusion lifted: p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms")
    result = {
        "bench": "fabric_exclusion",
        "samples": len(flagged),
        "poll_s": args.poll,
        "stable_s": args.stable,
        "gap_s": args.gap,
        "set_p50_ms": f["p50_ms"],
        "set_p99_ms": f["p99_ms"],
        "set_max_ms": f["max_ms"],
        "lifted_p50_ms": c["p50_ms"],
        "lifted_p99_ms": c["p99_ms"],
        "lifted_max_ms": c["max_ms"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
