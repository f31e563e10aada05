"""Table tests of the secured bed's identity rule (tests/chaos/secured.py): each process
runs with its own bus credential, a service with its own PostgreSQL role, an agent
with no database login."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.security import BusSecrets
from tests.chaos.secured import identity_lapses, open_bus, trust_logins

BUS = BusSecrets(Path("/bed/state"))
SECRETS = "/bed/state/secrets"
ROLE_URL = "postgresql://muster_placer@127.0.0.1:5432/muster?passfile=/p"

CASES: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "a service replica with its own credential and role is fine": (
        "placer-1",
        {"MUSTER_NATS_CREDS": f"{SECRETS}/nats-placer.nk", "MUSTER_DATABASE_URL": ROLE_URL},
        [],
    ),
    "a service on the superuser's login is a lapse": (
        "placer",
        {
            "MUSTER_NATS_CREDS": f"{SECRETS}/nats-placer.nk",
            "MUSTER_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/muster",
        },
        ["placer logs in to PostgreSQL as 'postgres', not muster_placer"],
    ),
    "a service with another service's bus credential is a lapse": (
        "placer",
        {"MUSTER_NATS_CREDS": f"{SECRETS}/nats-admin.nk", "MUSTER_DATABASE_URL": ROLE_URL},
        [
            f"placer connects to NATS as '{SECRETS}/nats-admin.nk',"
            f" not with {SECRETS}/nats-placer.nk"
        ],
    ),
    "an agent with its node's credential and no database password is fine": (
        "node-node02",
        {
            "MUSTER_NATS_CREDS": f"{SECRETS}/nats-node-node02.nk",
            "MUSTER_DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/muster",
        },
        [],
    ),
    "an agent with another node's credential and a password file is two lapses": (
        "node-node02",
        {
            "MUSTER_NATS_CREDS": f"{SECRETS}/nats-node-node01.nk",
            "MUSTER_DATABASE_URL": "postgresql://postgres@h:1/muster?passfile=/x",
        },
        [
            "node-node02 holds a database password file",
            f"node-node02 connects to NATS as '{SECRETS}/nats-node-node01.nk',"
            f" not with {SECRETS}/nats-node-node02.nk",
        ],
    ),
    "a process gone (no environment) has no identity": (
        "health",
        {},
        [
            "health logs in to PostgreSQL as None, not muster_health",
            f"health connects to NATS as 'nobody', not with {SECRETS}/nats-health.nk",
        ],
    ),
    "a server is not judged": ("server-nats", {}, []),
}


@pytest.mark.parametrize(("key", "env", "want"), CASES.values(), ids=CASES.keys())
def test_identity_lapses(key: str, env: dict[str, str], want: list[str]) -> None:
    assert identity_lapses(key, env, BUS) == want


async def test_an_open_bus_and_trust_logins_are_lapses(nats_url: str, database_url: str) -> None:
    # The suite's own servers run without authentication: what a secured bed must not be.
    assert await open_bus(nats_url) == ["NATS let a client with no credential connect"]
    assert await trust_logins(database_url) == [
        "PostgreSQL let the superuser in with no password (trust logins)"
    ]
