"""Test support: a secured local cluster (opt-in; `running_cluster` stays insecure) —
its own NATS with the bus permissions and its own PostgreSQL with SCRAM logins and a role
per service, as `muster up` starts them (muster.secure_up), and every service and node
agent as a real process with its own credentials."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from muster.client import register_cluster
from muster.cluster import Cluster, NodeDef
from muster.secure_up import LocalSecurity, local_users_by_key
from shared import embedded
from tests.support.cluster import identity_settings, make_cluster, nodes_up

DATABASE = "muster"


@dataclass
class Secured:
    cluster: Cluster
    security: LocalSecurity
    nats_url: str
    pg_url: str  # the server, no credentials: postgresql://postgres@127.0.0.1:PORT
    admin_url: str  # the superuser's database URL (its password in a pgpass file)

    def role_url(self, role: str) -> str:
        return self.security.role_url(self.pg_url, DATABASE, role)

    def creds(self, identity: str) -> str:
        return str(self.security.bus.creds(identity))

    def user_key(self, user: str) -> str:
        """A test user's key file: their API signing key and their bus credential."""
        return str(self.cluster.state_dir / "keys" / f"{user}.nk")


@contextlib.contextmanager
def secured_cluster(node_defs: list[NodeDef], *, tls: bool = False) -> Iterator[Secured]:
    """Servers, services and `node_defs` up (nodes UP) in a fresh folder; all stopped
    and removed on the way out. Not under pytest's root: PostgreSQL may run as its own
    user, who must reach the folder."""
    root = Path(tempfile.mkdtemp(prefix="muster-secure-"))
    servers: list[embedded.Server] = []
    cluster: Cluster | None = None
    saved = {k: os.environ.get(k) for k in ("MUSTER_NATS_CREDS", "MUSTER_NATS_TLS_CA")}
    try:
        identity = identity_settings(root)  # the users' keys, on the bus from the start
        users = local_users_by_key(
            {
                "MUSTER_CLUSTER_CONFIG": identity["cluster_config"],
                "MUSTER_USER_KEYS_DIR": identity["user_keys_dir"],
            }
        )
        sec = LocalSecurity.make(root, [n.name for n in node_defs], tls=tls, users_by_key=users)
        nats = embedded.start_nats(root, config=sec.nats_config())
        servers.append(nats)
        pg = embedded.start_postgres(root, fast=True, password=sec.pg_password)
        servers.append(pg)
        embedded.create_database(pg.url, DATABASE, password=sec.pg_password)
        admin_url = sec.prepare_database(pg.url, DATABASE)
        cluster = make_cluster(root, nats.url, admin_url)
        cluster.plan_services()
        for node in node_defs:
            cluster.plan_node(node)
        sec.apply(cluster.specs, pg.url, DATABASE)
        for key in list(cluster.specs):
            cluster.respawn(key)
        register_cluster(nats.url, root)  # this process calls as a user, injects as admin
        asyncio.run(_nodes_up(admin_url, len(node_defs)))
        yield Secured(cluster, sec, nats.url, pg.url, admin_url)
    finally:
        if cluster is not None:
            cluster.stop_all(timeout=10)
        for server in reversed(servers):
            server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(root, ignore_errors=True)


async def _nodes_up(url: str, count: int) -> None:
    db = await asyncpg.connect(url)
    try:
        await nodes_up(db, count, timeout=120)  # a loaded 2-core box
    finally:
        await db.close()
