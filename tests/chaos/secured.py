"""Shell of the chaos checker: whether the bed runs secured as `muster up` does, judged
from the outside before the faults begin (and so after every restart the schedule
makes, which starts a process from the same spec and a server from the same config).

A client with no credential must be refused by NATS and PostgreSQL alike, and every
process must run with its own identity, read from its environment in `/proc` as `ps`
shows it: a service with its bus credential and its PostgreSQL role, a node agent with
its node's credential and no database login at all. Each lapse is a line of the verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import asyncpg
import nats
import nats.errors

from muster.cluster import SERVICES
from shared import bus_auth, db_roles
from shared.security import BusSecrets
from shared.urls import nats_servers
from tests.chaos.machine import environ

if TYPE_CHECKING:
    from tests.chaos.bed import ChaosBed

REFUSED = (nats.errors.Error, OSError, TimeoutError)


async def lapses(bed: ChaosBed) -> list[str]:
    """What of a secured bed is not secured (empty: all of it is)."""
    found = await open_bus(bed.url)
    found += await trust_logins(bed.database_url)
    bus = BusSecrets(Path(bed.cluster.state_dir))
    for key, pid in sorted(bed.cluster.pids.items()):
        found += identity_lapses(key, environ(pid), bus)
    return found


async def open_bus(url: str) -> list[str]:
    try:
        nc = await nats.connect(
            nats_servers(url),
            connect_timeout=3,
            allow_reconnect=False,
            max_reconnect_attempts=0,
            error_cb=_quiet,  # the refusal is the answer wanted, not news for the log
        )
    except REFUSED:
        return []
    await nc.close()
    return ["NATS let a client with no credential connect"]


async def _quiet(err: Exception) -> None:
    del err


async def trust_logins(url: str) -> list[str]:
    """The superuser with no password (the bed's URL without its passfile)."""
    where = urlsplit(url)
    bare = f"postgresql://{where.username}@{where.hostname}:{where.port}{where.path}"
    try:
        conn = await asyncpg.connect(bare, timeout=5, passfile="/nonexistent")
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
        return []
    await conn.close()
    return ["PostgreSQL let the superuser in with no password (trust logins)"]


def identity_lapses(key: str, env: dict[str, str], bus: BusSecrets) -> list[str]:
    """Pure: what is wrong with process `key`'s identity, from its environment."""
    service = key.split("-")[0]
    if service in SERVICES:
        want, role = str(bus.creds(service)), db_roles.role_of(service)
        user = urlsplit(env.get("MUSTER_DATABASE_URL", "")).username
        found = [] if user == role else [f"{key} logs in to PostgreSQL as {user!r}, not {role}"]
    elif key.startswith("node-"):
        want = str(bus.creds(bus_auth.agent_name(key.removeprefix("node-"))))
        url = env.get("MUSTER_DATABASE_URL", "")
        found = [f"{key} holds a database password file"] if "passfile" in url else []
    else:
        return []
    have = env.get("MUSTER_NATS_CREDS", "")
    if have != want:
        found.append(f"{key} connects to NATS as {have or 'nobody'!r}, not with {want}")
    return found
