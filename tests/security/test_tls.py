"""TLS where `muster up --tls` puts it (docs/security.md, "TLS"), against real servers:
PostgreSQL takes TCP logins over verified TLS only; a NATS cluster's routes are TLS
both ways and a server whose certificate the cluster's CA did not sign cannot join;
and a whole `muster up --tls --nats-servers 3` runs a job with every service's
database connection encrypted."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from muster.secure_up import LocalSecurity
from shared import embedded, pg_install
from shared.db import create_pool
from shared.security import TlsFiles, make_tls, nats_options
from shared.settings import Settings
from shared.transient import is_transient
from tests.support.cluster import FAST, REPO, eventually

ONCE = {"Nats-Msg-Id": "tls-hello"}  # a publish tried again is stored once

pytestmark = pytest.mark.slow

needs_pg_tls = pytest.mark.skipif(
    not embedded.pg_tls_available(),
    reason="PostgreSQL with TLS needs a build with OpenSSL: apt-get install postgresql",
)

ENCRYPTED = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


@pytest.fixture
def root() -> Iterator[Path]:
    # Not under pytest's root: PostgreSQL may run as its own user, who must reach it.
    folder = Path(tempfile.mkdtemp(prefix="muster-tls-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def without_tls(url: str) -> str:
    return re.sub(r"&sslmode=[^&]*&sslrootcert=[^&]*", "", url)


@needs_pg_tls
async def test_postgres_with_tls_takes_verified_tls_logins_only(root: Path) -> None:
    sec = LocalSecurity.make(root, [], tls=True)
    assert sec.tls is not None
    pg = await asyncio.to_thread(
        embedded.start_postgres, root, fast=True, password=sec.pg_password, tls=sec.tls
    )
    try:
        embedded.create_database(pg.url, "muster", password=sec.pg_password, ca=sec.pg_ca)
        await asyncio.to_thread(sec.prepare_database, pg.url, "muster")
        url = sec.role_url(pg.url, "muster", "muster_placer")
        assert "sslmode=verify-full" in url and f"sslrootcert={sec.tls.ca}" in url

        conn = await asyncpg.connect(url)  # a service's URL: its role, verified TLS
        assert await conn.fetchval(ENCRYPTED) is True
        await conn.close()

        with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError, match="no encrypt"):
            await asyncpg.connect(without_tls(url), ssl=False)  # right password, no TLS

        other = make_tls(root / "other")  # a CA that did not sign the server
        with pytest.raises(ssl.SSLCertVerificationError):
            await asyncpg.connect(url.replace(str(sec.tls.ca), str(other.ca)))

        # MUSTER_DB_TLS_CA: a URL that says nothing of TLS is verified all the same.
        trusting = Settings(database_url=without_tls(url), db_tls_ca=str(sec.tls.ca))
        pool = await create_pool(trusting, max_size=1)
        assert await pool.fetchval(ENCRYPTED) is True
        await pool.close()
        wrong = Settings(database_url=without_tls(url), db_tls_ca=str(other.ca))
        pool = await create_pool(wrong, max_size=1)  # connects on demand
        with pytest.raises(ssl.SSLCertVerificationError):
            await pool.fetchval("SELECT 1")
        await pool.close()
        assert (root / "pg" / "server.key").stat().st_mode & 0o777 == 0o600

        # TLS turned off again: the same folder takes plain logins (SCRAM still).
        pg.stop()
        port = int(pg.url.rsplit(":", 1)[1])
        pg = await asyncio.to_thread(
            embedded.start_postgres, root, port, fast=True, password=sec.pg_password
        )
        conn = await asyncpg.connect(without_tls(url), ssl=False)
        assert await conn.fetchval(ENCRYPTED) is False
        await conn.close()
    finally:
        pg.stop()


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        data: dict[str, Any] = json.load(reply)
        return data


def test_a_data_folder_that_no_postgresql_here_can_run_names_what_to_install(
    tmp_path: Path,
) -> None:
    (tmp_path / "PG_VERSION").write_text("99\n")
    with pytest.raises(pg_install.PgInstallError, match=r"major version 99.*apt-get install"):
        pg_install.pg_bin(tmp_path)


def route_port(config: Path) -> int:
    found = re.search(r"cluster \{[^}]*?port: (\d+)", config.read_text())
    assert found is not None
    return int(found.group(1))


async def test_nats_routes_are_tls_and_a_server_the_ca_did_not_sign_cannot_join(
    root: Path,
) -> None:
    tls = make_tls(root)
    bus = await asyncio.to_thread(
        embedded.start_nats_cluster, root, config=tls.nats_block(), cluster_tls=tls.route_block()
    )
    rogue: subprocess.Popen[bytes] | None = None
    try:
        # A rogue server trusts our CA but shows a certificate of its own making.
        own = make_tls(root / "rogue")
        forged = TlsFiles(ca=tls.ca, cert=own.cert, key=own.key)
        routes = ", ".join(f'"nats-route://127.0.0.1:{route_port(c)}"' for c in bus.configs)
        config, monitor = root / "rogue.conf", embedded.free_port()
        config.write_text(
            f'server_name: "rogue"\nhost: "127.0.0.1"\nport: {embedded.free_port()}\n'
            f'http: "127.0.0.1:{monitor}"\n'
            f'cluster {{ name: "muster", host: "127.0.0.1", port: {embedded.free_port()}, '
            f"routes: [{routes}], {forged.route_block()} }}\n"
        )
        rogue, _ = embedded._spawn_nats(config, root / "rogue.log")

        def refused() -> list[str]:
            lines = "".join(log.read_text() for log in (s.log_path for s in bus.servers))
            return re.findall(r"TLS route handshake error: .*unknown authority", lines)

        await eventually(
            lambda: asyncio.to_thread(refused), bool, what="the rogue's routes refused"
        )

        nc = await nats.connect(bus.url.split(","), **nats_options(tls_ca=str(tls.ca)))
        try:
            js = nc.jetstream()
            await js.add_stream(name="TLS", subjects=["tls.>"], num_replicas=3)

            async def published() -> bool:  # a stream just made may still elect its leader
                try:
                    await js.publish("tls.hello", b"over verified routes", headers=ONCE)
                except Exception as err:
                    if not is_transient(err):
                        raise
                    return False
                return True

            await eventually(published, bool, what="a publish over the routes")
            info = await js.stream_info("TLS")
            assert info.state.messages == 1
            assert info.cluster is not None
            peers = {info.cluster.leader, *(p.name for p in info.cluster.replicas or [])}
            assert peers == {"muster-0", "muster-1", "muster-2"}
        finally:
            await nc.close()
        # It keeps trying, and has no route: each is closed in the TLS handshake.
        routez = await asyncio.to_thread(get_json, f"http://127.0.0.1:{monitor}/routez")
        assert routez["num_routes"] == 0, routez
    finally:
        if rogue is not None:
            rogue.kill()
            rogue.wait()
        bus.stop()


TOPOLOGY = """\
gpus_per_node = 1
[[leaf]]
name = "leaf1"
nodes = ["node01"]
"""


def cli(state: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """`muster ARGS` with its own servers: no MUSTER_* URL of the test session leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSTER_")}
    env.update(FAST, PYTHONPATH=str(REPO), MUSTER_STATE_DIR=str(state))
    return subprocess.run(
        [sys.executable, "-m", "muster.cli", "--state", str(state), *args],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=str(state.parent),
    )  # fmt: skip


@needs_pg_tls
async def test_muster_up_tls_runs_a_job_with_every_connection_encrypted(root: Path) -> None:
    state, topology = root / "state", root / "topology.toml"
    state.mkdir()
    topology.write_text(TOPOLOGY)
    started = await asyncio.to_thread(
        cli, state, "up", "--tls", "--nats-servers", "3", "--topology", str(topology),
        "--wait", "120",
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        for config in state.glob("nats-*.conf"):
            assert "verify: true" in config.read_text()  # the routes' TLS
        url = json.loads((state / "cluster.json").read_text())["database_url"]
        assert "sslmode=verify-full" in url
        done = await asyncio.to_thread(cli, state, "submit", f"--chdir={state}", "--wrap", "true")
        assert done.returncode == 0, done.stdout + done.stderr
        job_id = int(done.stdout.split()[-1])
        db = await asyncpg.connect(url)
        try:
            await eventually(
                lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job_id),
                lambda s: s == "COMPLETED",
                timeout=90,
                what="the job completed",
            )
            rows = await db.fetch(
                "SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s"
                " USING (pid) WHERE a.backend_type = 'client backend'"
            )
        finally:
            await db.close()
        assert all(r["ssl"] for r in rows), rows
        roles = {r["usename"] for r in rows}
        assert {"muster_admission", "muster_placer", "muster_launcher"} <= roles, roles
    finally:
        if (state / "cluster.json").exists():
            await asyncio.to_thread(cli, state, "down")
