"""Shell: a local cluster with least privilege, as `muster up` starts it by default
(`--insecure` turns it off): NATS with one NKey user per identity and subject
permissions (`shared.bus_auth`), and PostgreSQL with SCRAM passwords and one role per
service (`shared.db_roles`); `--tls` adds a CA of its own and TLS, verified by every
client, on NATS (clients and routes) and on PostgreSQL.

`LocalSecurity.make` writes the secrets into the state folder (`shared.security`),
with a bus entry per user key registered where the services will look (the cluster
configuration and the keys folder, `local_users_by_key`); `nats_config` and
`pg_password` start the servers with them; `prepare_database` runs the migrations as
the superuser and creates the roles; `apply` gives every planned process its own bus
credential and database URL (paths only: no secret is in cluster.json), and admission
the authorization file to keep in step with the users' keys (MUSTER_NATS_AUTH_DIR).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import asyncpg

from shared import bus_auth, db_roles
from shared.db import migrate
from shared.security import (
    BusSecrets,
    TlsFiles,
    make_tls,
    pg_password,
    provision_bus,
    write_pgpass,
)

SUPERUSER = "postgres"


class Spec(Protocol):
    """How a process is started (muster.cluster.ProcSpec): its module and variables."""

    @property
    def module(self) -> str: ...
    @property
    def env(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class LocalSecurity:
    state_dir: Path
    bus: BusSecrets
    tls: TlsFiles | None

    @classmethod
    def make(
        cls,
        state_dir: Path,
        nodes: Iterable[str],
        *,
        tls: bool = False,
        users_by_key: Mapping[str, str] | None = None,
    ) -> LocalSecurity:
        """The secrets of a cluster in `state_dir`; `users_by_key` (public key -> user)
        the users' bus entries, by default those the services will honour."""
        users = local_users_by_key(os.environ) if users_by_key is None else users_by_key
        bus = provision_bus(state_dir, nodes, users)
        return cls(state_dir, bus, make_tls(state_dir) if tls else None)

    def nats_config(self) -> str:
        """The servers' authorization (an include: re-read at a reload) and TLS."""
        return self.bus.nats_config() + (self.tls.nats_block() if self.tls else "")

    def route_tls(self) -> str:
        """A NATS cluster's route TLS (`cluster { tls {...} }`), or none."""
        return self.tls.route_block() if self.tls else ""

    @property
    def pg_ca(self) -> str:
        """The CA psql verifies PostgreSQL with (no TLS: "")."""
        return str(self.tls.ca) if self.tls else ""

    @property
    def pg_password(self) -> str:
        return pg_password(self.state_dir, SUPERUSER)

    def role_url(self, server_url: str, database: str, role: str) -> str:
        """`role`'s URL for database `database`, its password in a pgpass file (0600);
        with TLS, the server verified against the CA (any other server is refused)."""
        where = urlsplit(server_url)
        host, port = where.hostname or "127.0.0.1", where.port or 5432
        passfile = write_pgpass(self.state_dir, role, host, port)
        tls = f"&{self.tls.pg_query()}" if self.tls else ""
        return f"postgresql://{role}@{host}:{port}/{database}?passfile={passfile}{tls}"

    def prepare_database(self, server_url: str, database: str) -> str:
        """Migrate `database` as the superuser, create a role per service with its
        grants; returns the superuser's URL (an operator's, and the tests')."""
        admin_url = self.role_url(server_url, database, SUPERUSER)
        asyncio.run(self._prepare(admin_url, database))
        return admin_url

    async def _prepare(self, admin_url: str, database: str) -> None:
        conn = await asyncpg.connect(admin_url)
        try:
            await migrate(conn)
            async with conn.transaction():
                for statement in db_roles.lockdown_statements(database):
                    await conn.execute(statement)
                for service in db_roles.OWNED:
                    password = pg_password(self.state_dir, db_roles.role_of(service))
                    for statement in db_roles.role_statements(service, password, database):
                        await conn.execute(statement)
        finally:
            await conn.close()

    def apply(self, specs: Mapping[str, Spec], server_url: str = "", database: str = "") -> None:
        """Give every planned process its identity: a service its bus user and (when
        the database is ours, `server_url` given) its role; a node agent its node's bus
        user (and no database login); anything else (a gateway) no bus credential of
        ours: it connects with the key of the user it acts as, as the CLI does."""
        ca = self.tls.ca if self.tls else None
        for key, spec in specs.items():
            service = spec.module.removeprefix("services.") if spec.module else ""
            if service in bus_auth.SERVICES:
                spec.env.update(self.bus.env(service, ca))
                if service == "admission":  # registered keys reach the bus (docs/security.md)
                    spec.env["MUSTER_NATS_AUTH_DIR"] = str(self.bus.folder)
                if server_url:
                    role = db_roles.role_of(service)
                    spec.env["MUSTER_DATABASE_URL"] = self.role_url(server_url, database, role)
            elif key.startswith("node-") and spec.module:
                spec.env.update(self.bus.env(bus_auth.agent_name(key.removeprefix("node-")), ca))
                if server_url:  # an agent uses no database: not the superuser's pgpass
                    spec.env["MUSTER_DATABASE_URL"] = f"{server_url}/{database}"
            elif spec.module and ca is not None:  # a gateway: its user's key, as the CLI
                spec.env["MUSTER_NATS_TLS_CA"] = str(ca)


def local_users_by_key(env: Mapping[str, str]) -> dict[str, str]:
    """The user keys the services of a local cluster honour (public key -> user): the
    cluster configuration's (`MUSTER_CLUSTER_CONFIG`) and the keys folder's
    (`MUSTER_USER_KEYS_DIR`); a configuration that does not parse adds none (admission
    refuses it, and renders the bus entries again from what it accepts)."""
    from shared.identity_files import directory_from_toml, read_key_dir

    path = env.get("MUSTER_CLUSTER_CONFIG", "")
    keys = read_key_dir(env.get("MUSTER_USER_KEYS_DIR", ""))
    try:
        text = Path(path).read_text() if path else ""
        return dict(directory_from_toml(text, keys).users_by_key)
    except (OSError, ValueError):
        return dict(directory_from_toml("", keys).users_by_key)
