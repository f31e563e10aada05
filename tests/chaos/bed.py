"""Shell: the chaos run's own bed — a PostgreSQL and NATS it may kill, every service
(at `replicas` each, as the cluster module plans them), one node agent per node.

Secured by default, as `muster up` runs (muster.secure_up.LocalSecurity): NATS with an
NKey user and subject permissions per service and per node agent (the same
authorization config on every (re)start of a server), PostgreSQL with SCRAM logins and
one role per service (kept in its data folder, so a restarted server has them), the
workload's requests signed by their users, agents running only what the launcher
signed. The harness itself connects as the PostgreSQL superuser (`database_url`: the
migrations, the audit journal, the checker's reads) and as the bus's operator (the
poison, XIDs as `muster inject-fault` sends them, the dead-letter read); no service
runs with either. `secure=False` is the old mode: no bus auth, `trust` logins.

Every process runs a copy of the code taken as the bed starts (`code/` in its folder):
one the schedule restarts runs what the run began with, not a working tree being edited
meanwhile (soak seed 410 and CI seed 2 each lost an agent to a half-made edit).

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
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from muster.client import register_cluster
from muster.cluster import SERVICES, Cluster
from muster.secure_up import LocalSecurity
from shared import embedded
from shared.db import migrate
from tests.chaos import audit
from tests.chaos.schedule import Targets
from tests.chaos.workload import CONFIG
from tests.support import netns
from tests.support.cluster import REPO, make_cluster, nodes, nodes_up

GPUS_PER_NODE = 2
DATABASE = "muster"
CODE = ("shared", "services", "muster")  # the packages a bed's processes import


@dataclass
class ChaosBed:
    folder: Path
    pg: embedded.Server
    database_url: str  # the harness's own privileged connection (the superuser when secured)
    nats: embedded.Server | embedded.NatsCluster
    cluster: Cluster
    net: netns.TestBed | None
    nats_config: str = ""  # the authorization a NATS server starts (and restarts) with

    @property
    def url(self) -> str:
        return self.cluster.nats_url

    @property
    def secure(self) -> bool:
        return bool(self.nats_config)

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
        """On the same port and store, and the same authorization: a member of a cluster
        from its own config file, the one server from the config it was given."""
        if isinstance(self.nats, embedded.NatsCluster):
            self.nats.restart(int(key.rsplit("-", 1)[1]))
            return
        host, port = self.nats.url.removeprefix("nats://").rsplit(":", 1)
        self.nats = embedded.start_nats(
            self.folder / "server-nats", int(port), host=host, config=self.nats_config
        )

    def restart_postgres(self) -> None:
        """On the same port and data folder: its SCRAM logins and roles are in there."""
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


async def _database(folder: Path, sec: LocalSecurity | None) -> tuple[embedded.Server, str]:
    """The server, and the harness's URL: as `muster up` prepares it when secured (the
    superuser migrates and makes the service roles), then the audit journal."""
    password = sec.pg_password if sec else ""
    pg = await asyncio.to_thread(embedded.start_postgres, folder / "pg", password=password)
    try:
        url = await asyncio.to_thread(embedded.create_database, pg.url, DATABASE, password=password)
        if sec is not None:
            url = await asyncio.to_thread(sec.prepare_database, pg.url, DATABASE)
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)  # done already when secured: then a no-op
            await audit.install_journal(conn)
        finally:
            await conn.close()
    except BaseException:
        await asyncio.to_thread(pg.stop)
        raise
    return pg, url


async def _bus(
    folder: Path, nats_servers: int, net: netns.TestBed | None, config: str
) -> embedded.Server | embedded.NatsCluster:
    if nats_servers == 3:
        return await asyncio.to_thread(embedded.start_nats_cluster, folder / "nats", config=config)
    host = net.control_address if net else "127.0.0.1"
    return await asyncio.to_thread(
        embedded.start_nats, folder / "server-nats", host=host, config=config
    )


def _snapshot(folder: Path) -> dict[str, str]:
    """Copy the code into `folder/code`; the variables that make a process import it
    (PYTHONSAFEPATH: not from its working folder, which comes first on sys.path
    otherwise; the editable install's path comes after PYTHONPATH)."""
    code = folder / "code"
    for name in CODE:
        shutil.copytree(REPO / name, code / name, ignore=shutil.ignore_patterns("__pycache__"))
    return {"PYTHONPATH": str(code), "PYTHONSAFEPATH": "1"}


def _start_cluster(bed: ChaosBed, n_nodes: int, replicas: int, sec: LocalSecurity | None) -> None:
    """Plan every process, give each its own identity (when secured), start them all."""
    config = bed.folder / "cluster.toml"
    config.write_text(CONFIG)
    os.environ["MUSTER_CLUSTER_CONFIG"] = str(config)  # after make_cluster's identity one
    bed.cluster.plan_services(replicas)
    for d in nodes(n_nodes, gpus=GPUS_PER_NODE):
        host = bed.net.hosts.get(d.name) if bed.net else None
        if host is None:
            bed.cluster.plan_node(d)
        else:
            bed.cluster.plan_node(d, host.exec_prefix(), MUSTER_NODE_ADDRESS=host.address)
    code = _snapshot(bed.folder)
    for spec in bed.cluster.specs.values():
        spec.env.update(code)
    if sec is not None:
        sec.apply(bed.cluster.specs, bed.pg.url, DATABASE)
        # This process calls as the users do and injects as the operator does.
        register_cluster(bed.url, bed.cluster.state_dir)
    for key in list(bed.cluster.specs):
        bed.cluster.respawn(key)


@contextlib.asynccontextmanager
async def chaos_bed(
    folder: Path,
    *,
    n_nodes: int,
    replicas: int,
    nats_servers: int,
    partitions: bool,
    secure: bool = True,
) -> AsyncIterator[ChaosBed]:
    want_net = partitions and nats_servers == 1 and not netns.available()
    net = netns.TestBed() if want_net else None
    names = [d.name for d in nodes(n_nodes)]
    state = folder / "state"
    sec = LocalSecurity.make(state, names) if secure else None
    nats_config = sec.nats_config() if sec else ""
    stops: list[Callable[[], None]] = []  # what to undo if the start fails part way
    bed: ChaosBed | None = None
    try:
        if net is not None:
            await asyncio.to_thread(net.create, names)
            stops.append(net.destroy)
        pg, url = await _database(folder, sec)
        stops.append(pg.stop)
        bus = await _bus(folder, nats_servers, net, nats_config)
        stops.append(bus.stop)
        cluster = make_cluster(state, bus.url, url)
        cluster.stream_replicas = 3 if nats_servers == 3 else 1  # every process's streams
        bed = ChaosBed(folder, pg, url, bus, cluster, net, nats_config)
        _start_cluster(bed, n_nodes, replicas, sec)
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
