"""Shell: the chaos run's own bed — a PostgreSQL and NATS it may kill, every service
(at `replicas` each, as the cluster module plans them), one node agent per node.

Two shapes, because the three-server NATS cluster listens on the loopback only:
- `nats_servers=1`: one NATS server on the test bed's bridge, each node agent in its own
  network namespace (tests/support/netns.py) where the machine allows, so a node can be
  partitioned;
- `nats_servers=3`: a JetStream cluster (shared/embedded.start_nats_cluster) with the
  streams at R3, agents in the root namespace (no partitions), any one server killable.
Everything it started is stopped on the way out, a failing start or run included.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from muster.cluster import SERVICES, Cluster
from shared import embedded
from shared.db import migrate
from tests.chaos import audit
from tests.chaos.schedule import Targets
from tests.chaos.workload import CONFIG
from tests.support import netns
from tests.support.cluster import make_cluster, nodes, nodes_up

GPUS_PER_NODE = 2


@dataclass
class ChaosBed:
    folder: Path
    pg: embedded.Server
    database_url: str
    nats: embedded.Server | embedded.NatsCluster
    cluster: Cluster
    net: netns.TestBed | None

    @property
    def url(self) -> str:
        return self.cluster.nats_url

    @property
    def nats_keys(self) -> tuple[str, ...]:
        if isinstance(self.nats, embedded.NatsCluster):
            return tuple(f"nats-{i}" for i in range(len(self.nats.servers)))
        return ("server-nats",)

    def kill_nats(self, key: str) -> None:
        if isinstance(self.nats, embedded.NatsCluster):
            self.nats.servers[int(key.rsplit("-", 1)[1])].kill()
        else:
            self.nats.kill()

    def restart_nats(self, key: str) -> None:
        if isinstance(self.nats, embedded.NatsCluster):
            self.nats.restart(int(key.rsplit("-", 1)[1]))
            return
        host, port = self.nats.url.removeprefix("nats://").rsplit(":", 1)
        self.nats = embedded.start_nats(self.folder / "server-nats", int(port), host=host)

    def restart_postgres(self) -> None:
        port = int(self.pg.url.rsplit(":", 1)[1])
        self.pg = embedded.start_postgres(self.folder / "pg", port)

    def partition(self, node: str) -> None:
        assert self.net is not None, "no network test bed: partitions are not scheduled"
        self.net.partition(node)

    def heal(self, node: str) -> None:
        assert self.net is not None
        self.net.heal(node)

    def targets(self) -> Targets:
        return Targets(
            services=tuple(k for k in self.cluster.pids if k.split("-")[0] in SERVICES),
            nodes=tuple(self.cluster.nodes),
            nats_servers=self.nats_keys,
            gpus_per_node=GPUS_PER_NODE,
        )

    def stop(self) -> None:
        self.cluster.stop_all(10)
        self.nats.stop()
        self.pg.stop()
        if self.net is not None:
            self.net.destroy()


async def _database(folder: Path) -> tuple[embedded.Server, str]:
    pg = await asyncio.to_thread(embedded.start_postgres, folder / "pg")
    url = await asyncio.to_thread(embedded.create_database, pg.url, "muster")
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
        await audit.install_journal(conn)
    finally:
        await conn.close()
    return pg, url


async def _bus(
    folder: Path, nats_servers: int, net: netns.TestBed | None
) -> embedded.Server | embedded.NatsCluster:
    if nats_servers == 3:
        return await asyncio.to_thread(embedded.start_nats_cluster, folder / "nats")
    host = net.control_address if net else "127.0.0.1"
    return await asyncio.to_thread(embedded.start_nats, folder / "server-nats", host=host)


def _start_cluster(bed: ChaosBed, n_nodes: int, replicas: int) -> None:
    config = bed.folder / "cluster.toml"
    config.write_text(CONFIG)
    os.environ["MUSTER_CLUSTER_CONFIG"] = str(config)  # after make_cluster's identity one
    bed.cluster.start_services(replicas)
    for d in nodes(n_nodes, gpus=GPUS_PER_NODE):
        host = bed.net.hosts.get(d.name) if bed.net else None
        if host is None:
            bed.cluster.start_node(d)
        else:
            bed.cluster.start_node(d, prefix=host.exec_prefix(), MUSTER_NODE_ADDRESS=host.address)


@contextlib.asynccontextmanager
async def chaos_bed(
    folder: Path, *, n_nodes: int, replicas: int, nats_servers: int, partitions: bool
) -> AsyncIterator[ChaosBed]:
    want_net = partitions and nats_servers == 1 and not netns.available()
    net = netns.TestBed() if want_net else None
    names = [d.name for d in nodes(n_nodes)]
    stops: list[Callable[[], None]] = []  # what to undo if the start fails part way
    bed: ChaosBed | None = None
    try:
        if net is not None:
            await asyncio.to_thread(net.create, names)
            stops.append(net.destroy)
        pg, url = await _database(folder)
        stops.append(pg.stop)
        bus = await _bus(folder, nats_servers, net)
        stops.append(bus.stop)
        cluster = make_cluster(folder / "state", bus.url, url)
        cluster.stream_replicas = 3 if nats_servers == 3 else 1  # every process's streams
        bed = ChaosBed(folder, pg, url, bus, cluster, net)
        _start_cluster(bed, n_nodes, replicas)
        conn = await asyncpg.connect(url)
        try:
            await nodes_up(conn, n_nodes, timeout=60)
        finally:
            await conn.close()
        yield bed
    finally:
        if bed is not None:
            await asyncio.to_thread(bed.stop)
        else:
            for stop in reversed(stops):
                await asyncio.to_thread(stop)
