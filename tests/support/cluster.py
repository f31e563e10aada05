"""Test support: a real local cluster (every service and node agent as its own
process) on the test's own NATS server and database, and polling helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TypedDict, TypeVar

import asyncpg
import nats

from muster.client import agent, call
from muster.cluster import DEFAULT_CLUSTER_CONFIG, SERVICES, Cluster, NodeDef
from shared.api import InjectFault, QueueReply, QueueRequest, SubmitReply, SubmitRequest
from shared.events import Event, encode, subject_of
from shared.identity_files import provision_keys
from shared.states import TERMINAL

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[2]

FAST = {
    "MUSTER_CYCLE_INTERVAL_S": "0.5",
    # Two-stage silence, short for tests: SUSPECT at 2 s, an agent fences its jobs at
    # 3 s, DOWN (jobs restarted elsewhere) at 4 s.
    "MUSTER_HEARTBEAT_TIMEOUT_S": "2",
    "MUSTER_FENCE_S": "3",
    "MUSTER_DOWN_AFTER_S": "4",
    "MUSTER_LEASE_TTL_S": "2",
    "MUSTER_FAULT_KILL_WAIT_S": "1",
    "MUSTER_KILL_WAIT_S": "3",
    "MUSTER_USAGE_TICK_S": "1",
    "MUSTER_LOG_LEVEL": "INFO",
}


# The users tests act as: each gets a key (state/keys/NAME.nk, its public key in
# NAME.pub, which the services honour through MUSTER_USER_KEYS_DIR).
TEST_USERS = ("root", "admin", "alice", "bob", "carol", "dave", "mallory")
# A cluster a test starts without a configuration of its own gets this identity-only
# one (no partitions: no placement policy): operators come only from configuration.
IDENTITY_CONFIG = '[roles]\noperators = ["root", "admin"]\n'


def spawn_services(c: Cluster) -> None:
    """Every service of `c`, admission with the local cluster's configuration (its
    partitions, QOS and limits, as `muster up` runs them)."""
    for name in SERVICES:
        extra = (
            {"MUSTER_CLUSTER_CONFIG": str(DEFAULT_CLUSTER_CONFIG)} if name == "admission" else {}
        )
        c.spawn(name, f"services.{name}", **extra)


@contextlib.asynccontextmanager
async def local_config_cluster(
    state: Path,
    nats_url: str,
    database_url: str,
    db: asyncpg.Connection,
    count: int,
    node_env: Mapping[str, Mapping[str, str]] | None = None,
) -> AsyncIterator[Cluster]:
    """Every service (admission with the local configuration) and `count` nodes, each
    with its `node_env` variables, all UP; stopped on the way out."""
    c = make_cluster(state, nats_url, database_url)
    try:
        spawn_services(c)
        for node in nodes(count):
            c.start_node(node, **(node_env or {}).get(node.name, {}))
        await nodes_up(db, count)
        yield c
    finally:
        c.stop_all(timeout=10)


def make_cluster(state: Path, nats_url: str, database_url: str) -> Cluster:
    """A cluster in `state` whose test users have keys, signing as the request's user
    (MUSTER_KEY_DIR) and registered with the services (MUSTER_USER_KEYS_DIR). These
    variables and MUSTER_CLUSTER_CONFIG are set on every call, so nothing of an earlier
    test's cluster is taken for this one's; a test's own config wins (running_cluster's
    env, or a spawn's extra variables)."""
    os.environ.update(FAST)
    os.environ.setdefault("PYTHONPATH", str(REPO))
    identity = identity_settings(state)
    os.environ.update(
        MUSTER_USER_KEYS_DIR=identity["user_keys_dir"],
        MUSTER_CLUSTER_CONFIG=identity["cluster_config"],
    )
    return Cluster(state, nats_url, database_url)


class Identity(TypedDict):
    """The Settings fields that name who the test users are (`identity_settings`)."""

    cluster_config: str
    user_keys_dir: str


def identity_settings(folder: Path) -> Identity:
    """The Settings fields of an in-process service that answers the test users (their
    keys, operators root and admin), this process signing as them."""
    keys = use_test_keys(folder / "keys")
    config = folder / "identity.toml"
    config.write_text(IDENTITY_CONFIG)
    return Identity(cluster_config=str(config), user_keys_dir=str(keys))


def use_test_keys(folder: Path) -> Path:
    """Provision the test users' keys in `folder` and sign this process's requests (and
    its children's) with them: `muster.client` picks NAME.nk for a request of NAME."""
    provision_keys(str(folder), TEST_USERS)
    os.environ["MUSTER_KEY_DIR"] = str(folder)
    return folder


@contextlib.asynccontextmanager
async def running_cluster(
    state: Path,
    nats_url: str,
    database_url: str,
    db: asyncpg.Connection,
    node_defs: list[NodeDef],
    *,
    replicas: int | Mapping[str, int] = 1,
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Cluster]:
    """Every service (`replicas` of each, see `Cluster.plan_services`) and `node_defs`
    as real processes, with `env` (MUSTER_* settings) set for them; all stopped on the
    way out, a failing start included."""
    env = env or {}
    saved = {k: os.environ.get(k) for k in env}
    try:
        c = make_cluster(state, nats_url, database_url)
        os.environ.update(env)  # after make_cluster's FAST: the caller's values win
        c.start_services(replicas)
        for node in node_defs:
            c.start_node(node)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        await nodes_up(db, len(node_defs))
        yield c
    finally:
        c.stop_all(timeout=10)


def nodes(count: int, gpus: int = 4, leaves: int = 2) -> list[NodeDef]:
    return [
        NodeDef(f"node{i + 1:02d}", gpus, "SIM-H100", ("spine0", f"leaf{i % leaves + 1}"))
        for i in range(count)
    ]


async def eventually(
    probe: Callable[[], Awaitable[T]],
    ok: Callable[[T], bool],
    timeout: float = 30.0,
    what: str = "",
) -> T:
    deadline = time.monotonic() + timeout
    last: T = await probe()
    while not ok(last):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or 'condition'}; last: {last!r}")
        await asyncio.sleep(0.2)
        last = await probe()
    return last


async def pid_from(path: Path, timeout: float = 30.0) -> int:
    """The pid a worker wrote to `path` (`echo $$ > path`), once it is there: the shell
    makes the file, empty, a moment before it writes the number."""

    def read() -> str:
        return path.read_text().strip() if path.exists() else ""

    text = await eventually(lambda: asyncio.to_thread(read), str.isdigit, timeout, f"{path}")
    return int(text)


async def settled_usage(db: asyncpg.Connection, job_id: int, timeout: float = 30.0) -> float:
    """The user's raw usage once fairshare has settled every attempt of `job_id`, its
    run's last one included (call it once the job ended): a usage tick (every second in
    these clusters) charges a running job before its end, so the first non-zero usage
    is often a part of the total. A timeout says where the settlement stopped: the
    charge rows, the run, and the `job.finished` outbox rows."""
    query = (
        "SELECT bool_and(c.settled) AND bool_or(c.attempt = r.attempt) AS settled"
        " FROM usage_charges c JOIN job_runs r USING (job_id) WHERE c.job_id = $1"
    )
    try:
        await eventually(
            lambda: db.fetchrow(query, job_id),
            lambda r: r is not None and bool(r["settled"]),
            timeout,
            "settled",
        )
    except AssertionError as err:
        charges = await db.fetch("SELECT * FROM usage_charges WHERE job_id = $1", job_id)
        run = await db.fetchrow("SELECT * FROM job_runs WHERE job_id = $1", job_id)
        relayed = await db.fetch(
            "SELECT event_id, published_at FROM outbox WHERE subject = 'muster.job.finished'"
        )
        inbox = await db.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'fairshare'")
        raise AssertionError(
            f"job {job_id}'s usage never settled: charges {[dict(r) for r in charges]};"
            f" run {dict(run) if run else None}; job.finished in the outbox"
            f" {[dict(r) for r in relayed]}; fairshare inbox {inbox} events"
        ) from err
    usage = await db.fetchval("SELECT sum(gpu_seconds) FROM usage")
    return float(usage or 0.0)


async def nodes_up(db: asyncpg.Connection, count: int, timeout: float = 30.0) -> None:
    await eventually(
        lambda: db.fetchval("SELECT count(*) FROM nodes WHERE state = 'UP'"),
        lambda n: n >= count,
        timeout,
        f"{count} nodes UP",
    )


async def submit(
    url: str,
    script: str,
    argv: tuple[str, ...] = (),
    workdir: str = "/tmp",
    user: str = "root",
    *,
    args: tuple[str, ...] = (),
    script_path: str = "job.sh",
) -> SubmitReply:
    req = SubmitRequest(
        user=user, argv=argv, script=script, workdir=workdir, script_path=script_path, args=args,
        environment=dict(os.environ),  # as the CLI sends it: the job's exported environment
    )  # fmt: skip
    return await call(url, "submit", req, SubmitReply)


async def queue(url: str, all_states: bool = True) -> QueueReply:
    return await call(url, "queue", QueueRequest(user="root", all_states=all_states), QueueReply)


async def ready(value: T) -> T:
    """`value` as an awaitable, for `eventually` to probe what is read without I/O
    (a file, /proc, ps)."""
    return value


def processes(command: str) -> list[str]:
    """The processes whose command line is `command` exactly, from `ps` (a client's own
    command line that holds it among other words does not count)."""
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=True)
    return [line for line in ps.stdout.splitlines() if line.strip() == command]


async def job_end(db: asyncpg.Connection, job_id: int, timeout: float = 60.0) -> asyncpg.Record:
    """The job's run row (state, exit_code) once it has ended."""
    row = await eventually(
        lambda: db.fetchrow("SELECT state, exit_code FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] in TERMINAL,
        timeout,
        f"job {job_id}'s end",
    )
    assert row is not None
    return row


async def job_state(db: asyncpg.Connection, job_id: int) -> str | None:
    state: str | None = await db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job_id)
    return state


async def inject(url: str, node: str, xid: int, gpu: int = 0) -> None:
    await agent(url, node, "inject", InjectFault(gpu=gpu, xid=xid))


@contextlib.contextmanager
def open_folder(prefix: str, mode: int) -> Iterator[Path]:
    """A folder of its own under /tmp with `mode`, removed afterwards: one a job's user
    must reach (0o755: a cluster's state, its spool) or write in (0o777: a job's
    working folder), which pytest's folders, private to root, do not allow."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    folder.chmod(mode)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, True)


def kill9(cluster: Cluster, key: str) -> None:
    cluster.kill(key, 9)
    pid = cluster.pids[key]
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def run_cli(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "muster.lean", *args],  # as the installed `muster` runs
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        cwd=env.get("CWD", "/tmp"),
    )


async def publish_event(url: str, event: Event) -> None:
    """Put `event` on the bus as a service's outbox relay would (a fact the test makes
    happen without the process that would normally report it)."""
    nc = await nats.connect(url)
    try:
        await nc.jetstream().publish(
            subject_of(event), encode(event), headers={"Nats-Msg-Id": str(event.event_id)}
        )
    finally:
        await nc.close()


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not), read from /proc as `ps` does."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
