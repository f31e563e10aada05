"""Failover figures on a local cluster with two replicas of every service on a
three-server NATS cluster (streams at R3).

- placer: the leading placer is SIGKILLed and a job submitted at once; measured from
  the kill (the database's clock) to the new leader's first allocation (its
  `created_at`, a later epoch). Goals: <= 2 s; Slurm's backup controller takes 120 s,
  kube-scheduler's lease 15 s. The killed placer is restarted before the next run.
- nats: a publisher sends events as fast as it can, each retried until acknowledged
  (the relay's way); the stream's leader server is SIGKILLed (then, in the same run, a
  follower), and the stall is the longest gap between two acknowledged publishes
  around it. A leader's loss costs the stream's election (seconds, in nats-server) plus
  the publish in flight waiting out its ack timeout (`Bus.publish`: 5 s). Nothing lost: the stream
  holds exactly the events sent. The server is restarted before the next run.

The handover is bounded by `--lease-ttl` (a standby takes an expired lease at its next
try, every third of it), so that is the knob; it is printed with the figures.

    .venv/bin/python bench/failover.py [--runs 5] [--lease-ttl 1.5]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from nats.js.errors import NoStreamResponseError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import FAST, latency_figures, provision_identity, wait_for_nodes
from muster.cluster import Cluster, NodeDef
from shared import embedded
from shared.bus import STREAM, Bus
from shared.events import NodeDown
from shared.transient import is_transient
from tests.support.cluster import submit

REPLICAS = 2
NEW_LEADER_PLANNED = (
    "SELECT extract(epoch FROM min(created_at) - $2::timestamptz)::float8"
    " FROM allocations WHERE epoch > $1"
)


async def leader(db: asyncpg.Connection) -> tuple[str, int]:
    while True:
        row = await db.fetchrow(
            "SELECT holder, epoch FROM placer_lease WHERE id = 1 AND expires_at > now()"
        )
        if row is not None:
            return row["holder"], row["epoch"]
        await asyncio.sleep(0.05)


def key_of(holder: str) -> str:
    instance = holder.split("-")[1]
    return "placer" if instance == "0" else f"placer-{instance}"


async def one_placer_failover(cluster: Cluster, db: asyncpg.Connection) -> float:
    holder, epoch = await leader(db)
    key = key_of(holder)
    killed_at = await db.fetchval("SELECT clock_timestamp()")
    os.kill(cluster.pids[key], signal.SIGKILL)
    cluster.procs[key].wait(10)
    await submit(cluster.nats_url, "#!/bin/bash\nsleep 0.2\n")
    deadline = time.monotonic() + 120
    while (took := await db.fetchval(NEW_LEADER_PLANNED, epoch, killed_at)) is None:
        if time.monotonic() > deadline:
            raise SystemExit("no new leader planned within 120 s")
        await asyncio.sleep(0.02)
    cluster.respawn(key)  # two replicas again for the next run
    await asyncio.sleep(3)  # it has connected and stands by
    return float(took)


async def placer_runs(cluster: Cluster, runs: int) -> list[float]:
    db = await asyncpg.connect(cluster.database_url)
    try:
        await wait_for_nodes(db, 2)
        out = []
        for run in range(runs):
            took = await one_placer_failover(cluster, db)
            out.append(took)
            print(f"placer run {run + 1}: new leader's first plan {took:.2f} s after the kill")
        return out
    finally:
        await db.close()


async def publish_acked(bus: Bus, event: NodeDown) -> None:
    """Retry one publish until acknowledged, with the same Nats-Msg-Id (the relay's way)."""
    while True:
        try:
            await bus.publish(event)
            return
        except Exception as err:  # no stream leader at this moment: retried
            if not (is_transient(err) or isinstance(err, NoStreamResponseError)):
                raise
            await asyncio.sleep(0.05)


async def one_nats_kill(
    nats: embedded.NatsCluster, bus: Bus, sent: list[uuid.UUID], *, leader: bool
) -> float:
    """Kill the stream's leader server (or, `leader` False, a follower) mid-stream;
    returns the longest gap between two acknowledged publishes."""
    info = await bus.js.stream_info(STREAM)
    assert info.cluster is not None
    name = info.cluster.leader if leader else (info.cluster.replicas or [])[0].name
    victim = int(str(name).rsplit("-", 1)[1])
    acked: list[float] = []
    stop_at: float | None = None
    killed = False
    while stop_at is None or time.monotonic() < stop_at:
        event = NodeDown(
            event_id=uuid.uuid4(), occurred_at=datetime.now(UTC), node="n", reason="bench"
        )
        await publish_acked(bus, event)
        sent.append(event.event_id)
        acked.append(time.monotonic())
        if not killed and len(acked) >= 200:
            nats.servers[victim].kill()
            killed, stop_at = True, time.monotonic() + 3.0
    await asyncio.to_thread(nats.restart, victim)
    return max(b - a for a, b in itertools.pairwise(acked))


async def nats_runs(state: Path, runs: int) -> tuple[list[float], list[float], int, int]:
    nats = embedded.start_nats_cluster(state / "bus")
    sent: list[uuid.UUID] = []
    try:
        bus = await Bus.connect(nats.url, name="failover-bench", stream_replicas=3)
        try:
            await bus.ensure_streams()
            leaders, followers = [], []
            for run in range(runs):
                leaders.append(await one_nats_kill(nats, bus, sent, leader=True))
                followers.append(await one_nats_kill(nats, bus, sent, leader=False))
                print(
                    f"nats run {run + 1}: longest publish stall {leaders[-1] * 1000:.0f} ms"
                    f" (stream leader killed), {followers[-1] * 1000:.0f} ms (a follower)"
                )
            stored = (await bus.js.stream_info(STREAM)).state.messages
        finally:
            await bus.close()
    finally:
        nats.stop()
    return leaders, followers, len(sent), stored


def start_cluster(state: Path) -> tuple[Cluster, embedded.NatsCluster, embedded.Server]:
    nats = embedded.start_nats_cluster(state / "ha")
    pg = embedded.start_postgres(state, fast=True)
    provision_identity(state)
    cluster = Cluster(
        state, nats.url, embedded.create_database(pg.url, "muster"), stream_replicas=3
    )
    cluster.start_services(REPLICAS)
    for i in range(2):
        cluster.start_node(NodeDef(f"node{i + 1:02d}", 4, "SIM-H100", ("spine0", "l1")))
    return cluster, nats, pg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lease-ttl", type=float, default=1.5)
    args = parser.parse_args()
    os.environ.update(FAST, MUSTER_LEASE_TTL_S=str(args.lease_ttl))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="muster-bench-", ignore_cleanup_errors=True) as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        (state / "ha").mkdir()
        (state / "bus").mkdir()
        cluster, nats, pg = start_cluster(state)
        try:
            placer = asyncio.run(placer_runs(cluster, args.runs))
        finally:
            cluster.stop_all()
            nats.stop()
            pg.stop()
        leaders, followers, sent, stored = asyncio.run(nats_runs(state, args.runs))
    result = latency_figures("placer_failover", placer, lease_ttl_s=args.lease_ttl)
    stall = latency_figures("nats_leader_kill_publish_stall", leaders)
    other = latency_figures("nats_follower_kill_publish_stall", followers)
    result |= {
        "nats_stall_p50_ms": stall["p50_ms"],
        "nats_stall_p99_ms": stall["p99_ms"],
        "nats_follower_stall_p50_ms": other["p50_ms"],
        "nats_follower_stall_p99_ms": other["p99_ms"],
        "nats_sent": sent,
        "nats_stored": stored,
        "nats_lost": sent - stored,
    }
    print(
        f"placer SIGKILL -> new leader's first plan: p50 {result['p50_ms']} ms,"
        f" p99 {result['p99_ms']} ms (lease {args.lease_ttl} s);"
        f" NATS stream-leader server SIGKILL -> publish stall p50 {stall['p50_ms']} ms,"
        f" p99 {stall['p99_ms']} ms (a follower: p50 {other['p50_ms']} ms);"
        f" {sent - stored} of {sent} lost"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
