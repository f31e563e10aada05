"""Shell: the secrets of a secured cluster — the bus's NKey credentials and its
`authorization` file, PostgreSQL passwords (pgpass files), a TLS CA and server
certificate (the openssl command) — written into a state folder, and the NATS client
options that use them.

Layout under the state folder (`muster up` fills it; docs/security.md):

    tls/ca.pem           the CA every client verifies the servers with (0644)
    tls/server.pem       the servers' certificate (NATS, its routes, PostgreSQL)
    secrets/ (0700)      nats-<identity>.nk (0600), nats-auth.conf (public keys only),
                         nats-servers/ (each NATS server's ports file, named by its
                         pid: whom `reload_nats` signals), pg-<role>.pgpass (0600),
                         tls/server-key.pem

Users have no bus credential here: each connects with their own API key
(`keys/NAME.nk` on a local cluster), registered in the authorization as they are in
the cluster configuration; `sync_bus_users` renders those entries again and has the
servers reload when keys are added or removed.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared import bus_auth
from shared.identity import Signer, encode_seed
from shared.identity_files import write_seed

SECRETS = "secrets"
OLD_USERS_CREDS = "nats-users.nk"  # the shared users' credential of before: removed
SERVERS = "nats-servers"  # NATS's ports_file_dir: one `nats-server_<pid>.ports` a server
# nats-server joins an `include` to the including file's folder, even an absolute path;
# `..` past the root stays at the root, so this many lead any include back to "/".
_TO_ROOT = "../" * 64


class SecurityError(RuntimeError):
    """A secret could not be made (the tool's message attached)."""


# --- client side ---------------------------------------------------------------------


def nats_options(creds: str = "", tls_ca: str = "", inbox_prefix: str = "") -> dict[str, Any]:
    """Keyword arguments for `nats.connect`: the NKey seed file that answers the
    server's challenge, a TLS context that verifies the server against `tls_ca`, the
    identity's own inbox prefix (its permissions allow only that one)."""
    options: dict[str, Any] = {}
    if creds:
        options["nkeys_seed"] = creds
    if tls_ca:
        options["tls"] = ssl.create_default_context(cafile=tls_ca)
    if inbox_prefix:
        options["inbox_prefix"] = inbox_prefix
    return options


def pg_ssl(tls_ca: str) -> ssl.SSLContext | None:
    """asyncpg's `ssl=`: TLS only, the server's certificate and name verified against
    `tls_ca`; None (no CA): whatever the URL says (`sslmode=verify-full&sslrootcert=`)."""
    return ssl.create_default_context(cafile=tls_ca) if tls_ca else None


# --- the bus -------------------------------------------------------------------------


@dataclass(frozen=True)
class BusSecrets:
    state_dir: Path

    @property
    def folder(self) -> Path:
        return self.state_dir / SECRETS

    @property
    def auth_conf(self) -> Path:
        return self.folder / "nats-auth.conf"

    @property
    def servers(self) -> Path:
        return self.folder / SERVERS

    def creds(self, name: str) -> Path:
        """The seed file of identity `name` ("admission", "node-node01", "admin")."""
        return self.folder / f"nats-{name}.nk"

    def nats_config(self) -> str:
        """What a NATS server's configuration needs: the authorization file, included
        (so a reload re-reads it, whichever folder the server's own file is in), and the
        folder its ports file goes to (so `reload_nats` finds every server)."""
        return (
            f'include "{_TO_ROOT}{str(self.auth_conf.resolve()).lstrip("/")}"\n'
            f'ports_file_dir: "{self.servers.resolve()}"\n'
        )

    def env(self, name: str, tls_ca: Path | None = None) -> dict[str, str]:
        """The MUSTER_* variables a process of identity `name` connects with."""
        env = {
            "MUSTER_NATS_CREDS": str(self.creds(name)),
            "MUSTER_NATS_INBOX_PREFIX": bus_auth.inbox_prefix(name),
        }
        if tls_ca is not None:
            env["MUSTER_NATS_TLS_CA"] = str(tls_ca)
        return env


def secrets_folder(state_dir: Path) -> Path:
    folder = state_dir / SECRETS
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    return folder


def provision_bus(
    state_dir: Path, nodes: Iterable[str], users_by_key: Mapping[str, str] | None = None
) -> BusSecrets:
    """A credential per identity (kept if there, so a restarted cluster keeps its keys)
    and the authorization file naming their public keys and permissions, with an entry
    per registered user key (`users_by_key`: public key -> user)."""
    out = BusSecrets(state_dir)
    secrets_folder(state_dir)
    out.servers.mkdir(exist_ok=True, mode=0o700)
    (state_dir / OLD_USERS_CREDS).unlink(missing_ok=True)  # it opens nothing any more
    wanted: list[tuple[str, bus_auth.Permissions]] = [
        (bus_auth.Kind.ADMIN, bus_auth.Permissions(everything=True)),
        *((s, bus_auth.service_permissions(s)) for s in bus_auth.SERVICES),
        *((bus_auth.agent_name(n), bus_auth.agent_permissions(n)) for n in nodes),
    ]
    users = []
    for name, permissions in wanted:
        path = out.creds(name)
        if not path.exists():
            write_seed(str(path), encode_seed(os.urandom(32)))
        public = Signer(path.read_text().strip()).public_key
        users.append(bus_auth.BusUser(name=name, nkey=public, permissions=permissions))
    user_keys = bus_auth.user_bus_users(users_by_key or {})
    _write_private(out.auth_conf, bus_auth.render_authorization(users, user_keys))
    return out


def sync_bus_users(folder: Path, users_by_key: Mapping[str, str]) -> int | None:
    """Render the users' entries of the authorization file in `folder` (a secrets
    folder) from `users_by_key` and, when that changed the file, have every NATS server
    using it reload; the number of servers signalled, or None when nothing changed."""
    auth = folder / "nats-auth.conf"
    text = auth.read_text()
    new = bus_auth.with_users(text, bus_auth.user_bus_users(users_by_key))
    if new == text:
        return None
    _write_private(auth, new)
    return reload_nats(folder / SERVERS)


def reload_nats(servers: Path) -> int:
    """SIGHUP (`nats-server --signal reload`) every live NATS server that left its ports
    file in `servers`; a file of a server gone (killed) is removed. The count signalled."""
    done = 0
    for ports in sorted(servers.glob("*_*.ports")):
        pid_text = ports.stem.rpartition("_")[2]
        pid = int(pid_text) if pid_text.isdigit() else 0
        if pid and _is_nats_server(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)
                done += 1
        else:
            ports.unlink(missing_ok=True)
    return done


def _is_nats_server(pid: int) -> bool:
    """Whether `pid` is still a nats-server (a pid reused by anything else must not get
    a SIGHUP: for most processes that is the end)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"nats-server"


# --- TLS -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def nats_block(self) -> str:
        """The client port's `tls` block: clients verify the server against the CA."""
        return (
            f'tls {{ cert_file: "{self.cert}", key_file: "{self.key}", '
            f'ca_file: "{self.ca}", timeout: 5 }}\n'
        )

    def route_block(self) -> str:
        """The `tls` block of a NATS `cluster {}`: every route is TLS both ways and each
        side must show a certificate the CA signed (`verify`), so a server without one
        cannot join. The server certificate has no extended key usage: it serves as the
        route's client certificate too."""
        return (
            f'tls {{ cert_file: "{self.cert}", key_file: "{self.key}", '
            f'ca_file: "{self.ca}", verify: true, timeout: 5 }}'
        )

    def pg_query(self) -> str:
        """What a PostgreSQL URL needs to speak TLS only and verify the server's
        certificate and name against the CA (libpq's and asyncpg's parameters)."""
        return f"sslmode=verify-full&sslrootcert={self.ca}"


def make_tls(state_dir: Path, hosts: Iterable[str] = ("127.0.0.1",)) -> TlsFiles:
    """A CA and a server certificate for `hosts` (IP addresses or names), made with the
    openssl command; kept if there. The CA's key is thrown away: nothing else is signed."""
    public = state_dir / "tls"
    private = secrets_folder(state_dir) / "tls"
    public.mkdir(parents=True, exist_ok=True)
    private.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = TlsFiles(public / "ca.pem", public / "server.pem", private / "server-key.pem")
    if files.ca.exists() and files.cert.exists() and files.key.exists():
        return files
    openssl = shutil.which("openssl")
    if openssl is None:
        raise SecurityError("muster up --tls needs the openssl command (apt-get install openssl)")
    san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    with tempfile.TemporaryDirectory() as tmp:
        ca_key, csr, ext = Path(tmp, "ca-key.pem"), Path(tmp, "server.csr"), Path(tmp, "ext")
        ext.write_text(f"subjectAltName={san},DNS:localhost\n")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _run(openssl, "req", "-x509", *ec, "-keyout", ca_key, "-out", files.ca, "-days",
             "825", "-subj", "/CN=muster local CA")  # fmt: skip
        _run(openssl, "req", *ec, "-keyout", files.key, "-out", csr, "-subj", "/CN=muster")
        _run(openssl, "x509", "-req", "-in", csr, "-CA", files.ca, "-CAkey", ca_key,
             "-CAcreateserial", "-out", files.cert, "-days", "825", "-extfile", ext)  # fmt: skip
    files.key.chmod(0o600)
    files.ca.chmod(0o644)
    return files


def _run(*argv: str | Path) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        raise SecurityError(f"{argv[0]} {argv[1]} failed: {done.stderr.strip()}")


# --- PostgreSQL ----------------------------------------------------------------------


def new_password() -> str:
    return secrets.token_urlsafe(24)


def pg_password(state_dir: Path, role: str) -> str:
    """Role `role`'s password, generated once into the secrets folder (0600)."""
    path = secrets_folder(state_dir) / f"pg-{role}.password"
    if not path.exists():
        _write_private(path, new_password())
    return path.read_text().strip()


def write_pgpass(state_dir: Path, role: str, host: str, port: int) -> Path:
    """A libpq password file for `role` (PGPASSFILE; asyncpg and psql read it), 0600."""
    path = secrets_folder(state_dir) / f"pg-{role}.pgpass"
    password = pg_password(state_dir, role).replace("\\", "\\\\").replace(":", "\\:")
    _write_private(path, f"{host}:{port}:*:{role}:{password}\n")
    return path


def _write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from the start (a temporary name of this
    writer's own: admission replicas may rewrite the bus authorization at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
