"""Benchmark support: a throwaway local cluster (embedded servers, every service and
node agent as processes) in a temporary folder."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from muster.cluster import Cluster, NodeDef
from shared import embedded
from shared.identity_files import provision_keys

FAST = {
    "MUSTER_CYCLE_INTERVAL_S": "0.5",
    "MUSTER_HEARTBEAT_TIMEOUT_S": "5",
    "MUSTER_FAULT_KILL_WAIT_S": "1",
    "MUSTER_LOG_LEVEL": "WARNING",
}


def provision_identity(state: Path) -> None:
    """Requests are signed: a key for root (the benchmarks' user), and root an operator
    by an identity-only configuration unless the benchmark names its own."""
    keys = str(state / "keys")
    provision_keys(keys, ("root",))
    (state / "identity.toml").write_text('[roles]\noperators = ["root"]\n')
    os.environ.update(MUSTER_USER_KEYS_DIR=keys, MUSTER_KEY_DIR=keys)
    os.environ.setdefault("MUSTER_CLUSTER_CONFIG", str(state / "identity.toml"))


@contextlib.contextmanager
def throwaway_database() -> Iterator[str]:
    """A throwaway PostgreSQL (fsync off) in a temporary folder, and a database on it:
    its URL, for the benchmarks of SQL alone."""
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        pg = embedded.start_postgres(state, fast=True)
        try:
            yield embedded.create_database(pg.url, "muster")
        finally:
            pg.stop()


@contextlib.contextmanager
def local_cluster(
    node_count: int,
    gpus: int = 4,
    *,
    replicas: int | Mapping[str, int] = 1,
    nats_servers: int = 1,
    env: Mapping[str, str] | None = None,
) -> Iterator[Cluster]:
    """`replicas` of every service (`Cluster.plan_services`) on one NATS server or, with
    `nats_servers` 3, a JetStream cluster with the streams at R3: the price of HA. `env`:
    environment variables set over `FAST` for the cluster's processes."""
    os.environ.update(FAST | dict(env or {}))
    # A benchmark stopped by SIGTERM (e.g. `timeout`) still stops its cluster.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="muster-bench-") as tmp:
        state = Path(tmp)
        state.chmod(0o755)
        nats = start_nats(state, nats_servers)
        pg = embedded.start_postgres(state, fast=True)
        try:
            provision_identity(state)
            cluster = Cluster(
                state,
                nats.url,
                embedded.create_database(pg.url, "muster"),
                stream_replicas=min(nats_servers, 3),
            )
            cluster.start_services(replicas)
            for i in range(node_count):
                leaf = f"leaf{i % 2 + 1}"
                cluster.start_node(NodeDef(f"node{i + 1:02d}", gpus, "SIM-H100", ("spine0", leaf)))
            try:
                yield cluster
            finally:
                cluster.stop_all()
        finally:
            nats.stop()
            pg.stop()


def start_nats(state: Path, servers: int) -> embedded.Server | embedded.NatsCluster:
    """One NATS server, or a JetStream cluster of `servers` (both have `url`, `stop`)."""
    if servers > 1:
        return embedded.start_nats_cluster(state, servers)
    return embedded.start_nats(state)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def latency_figures(name: str, seconds: list[float], **extra: object) -> dict[str, object]:
    """The JSON figures of a latency benchmark: count, p50, p99 and max in ms."""
    return {
        "bench": name,
        "samples": len(seconds),
        **extra,
        "p50_ms": round(percentile(seconds, 50) * 1000, 1),
        "p99_ms": round(percentile(seconds, 99) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
    }


def wait_until(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


async def wait_for_nodes(db: object, count: int) -> None:
    """Until `count` nodes are UP (the services create the tables as they start)."""
    import asyncio

    import asyncpg

    assert isinstance(db, asyncpg.Connection)
    while True:
        try:
            if await db.fetchval("SELECT count(*) FROM nodes WHERE state = 'UP'") >= count:
                return
        except asyncpg.UndefinedTableError:
            pass
        await asyncio.sleep(0.2)


async def poll_run(db, job_id: int, ok):  # type: ignore[no-untyped-def]
    """The job's run row once `ok(row)` holds (state, nodes, restart_count and `seg`, its
    segment's start in epoch seconds), polled every 5 ms for up to a minute."""
    import asyncio

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = await db.fetchrow(
            "SELECT state, nodes, restart_count, extract(epoch FROM segment_start)::float8 AS seg"
            " FROM job_runs WHERE job_id = $1",
            job_id,
        )
        if row is not None and ok(row):
            return row
        await asyncio.sleep(0.005)
    raise SystemExit(f"job {job_id} did not get there")
