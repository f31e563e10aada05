"""Shell: a whole local cluster as processes — embedded NATS and PostgreSQL, every
service, one agent per simulated node — started into a state folder (`muster up`) and
stopped from it (`muster down`).

`muster up` starts the servers and hands the rest to `muster.supervisor`, which starts
and restarts them; `cluster.json` holds every current pid and how to start each process
(`specs`). Tests drive a `Cluster` directly (`start_services`, `start_node`), without
a supervisor. `stop_all` stops in stages: supervisor, agents, job workers, services,
servers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from muster.secure_up import LocalSecurity
from services.launcher.worker_table import stop_recorded_workers
from shared import embedded, ports
from shared.agent_auth import ensure_launcher_key
from shared.metrics import METRICS_FOLDER, read_endpoints

SERVICES = ("admission", "placer", "launcher", "health", "fairshare")
GATEWAY_PORT = 8780  # `muster up`'s dashboard, unless MUSTER_HTTP_PORT names another
# The policy `muster up` starts admission with, unless MUSTER_CLUSTER_CONFIG names another.
DEFAULT_CLUSTER_CONFIG = (
    Path(__file__).resolve().parent.parent / "deploy" / "local" / "cluster.toml"
)


@dataclass(frozen=True)
class NodeDef:
    name: str
    gpus: int
    gpu_model: str
    topology: tuple[str, ...]
    features: tuple[str, ...] = ()  # what --constraint matches (Slurm's Features=)
    fabric: tuple[str, ...] = ()  # the fabric links its agent watches (MUSTER_FABRIC)


def load_topology(path: Path) -> list[NodeDef]:
    """Read a topology file (see deploy/local/topology.toml); errors name the key."""
    data = tomllib.loads(path.read_text())
    gpus = int(data.get("gpus_per_node", 4))
    model = str(data.get("gpu_model", "SIM-H100"))
    features = tuple(str(f) for f in data.get("features", ()))
    nodes: list[NodeDef] = []
    for leaf in data.get("leaf", []):
        if "name" not in leaf or "nodes" not in leaf:
            raise ValueError(f"{path}: every [[leaf]] needs 'name' and 'nodes'")
        path_ = tuple(p for p in (leaf.get("spine"), leaf["name"]) if p)
        for name in leaf["nodes"]:
            own = tuple(dict.fromkeys((*features, *map(str, leaf.get("features", ())))))
            count = int(leaf.get("gpus_per_node", gpus))
            fabric = tuple(map(str, leaf.get("fabric", data.get("fabric", ()))))
            nodes.append(
                NodeDef(name, count, str(leaf.get("gpu_model", model)), path_, own, fabric)
            )
    if not nodes:
        raise ValueError(f"{path}: no nodes; add a [[leaf]] with nodes = [...]")
    return nodes


@dataclass(frozen=True)
class ProcSpec:
    """How to start one process of the cluster again: its module and extra variables,
    and a command it runs under (`ip netns exec NS` puts an agent on another host). No
    module: `prefix` is the whole command (a NATS server of a cluster)."""

    module: str
    env: dict[str, str]
    prefix: tuple[str, ...] = ()


@dataclass
class Cluster:
    state_dir: Path
    nats_url: str
    database_url: str
    pids: dict[str, int] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)
    specs: dict[str, ProcSpec] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # ours only
    stream_replicas: int = 1  # 3 on a three-server NATS cluster
    http: str = ""  # the gateway's URL (REST API and dashboard), once planned

    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def save(self) -> None:
        """Write the state file atomically: the supervisor rewrites it at each restart
        while an operator or a test may be reading it."""
        data = {
            "nats_url": self.nats_url,
            "database_url": self.database_url,
            "pids": self.pids,
            "nodes": self.nodes,
            "stream_replicas": self.stream_replicas,
            "metrics": self.metrics_endpoints(),  # every process's /metrics URL
            "http": self.http,
            "specs": {
                k: {"module": s.module, "env": s.env, "prefix": list(s.prefix)}
                for k, s in self.specs.items()
            },
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.state_file)

    @classmethod
    def load(cls, state_dir: Path) -> Cluster:
        data = json.loads((state_dir / "cluster.json").read_text())
        specs = {
            k: ProcSpec(v["module"], v["env"], tuple(v.get("prefix", ())))
            for k, v in data.get("specs", {}).items()
        }
        return cls(
            state_dir,
            data["nats_url"],
            data["database_url"],
            data["pids"],
            data["nodes"],
            specs,
            stream_replicas=int(data.get("stream_replicas", 1)),
            http=str(data.get("http", "")),
        )

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        # A local cluster runs your jobs as you, even when you are root (a container);
        # a real node agent refuses root jobs unless MUSTER_ALLOW_ROOT_JOBS says so.
        env.setdefault("MUSTER_ALLOW_ROOT_JOBS", "true")
        env.update(
            MUSTER_NATS_URL=self.nats_url,
            MUSTER_DATABASE_URL=self.database_url,
            MUSTER_STATE_DIR=str(self.state_dir),
            MUSTER_STREAM_REPLICAS=str(self.stream_replicas),
        )
        env.update(extra)
        return env

    def spawn(self, key: str, module: str, prefix: Sequence[str] = (), **extra: str) -> int:
        """Start `module` as process `key` (and remember how, for a restart)."""
        self.specs[key] = ProcSpec(module, dict(extra), tuple(prefix))
        return self.respawn(key)

    def respawn(self, key: str) -> int:
        """Start process `key` from its recorded spec; its log file is appended to."""
        spec = self.specs[key]
        ensure_launcher_key(str(self.state_dir))  # agents run only what the launcher signs
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{key}.log").open("ab") as log:
            proc = subprocess.Popen(
                [*spec.prefix, sys.executable, "-m", spec.module] if spec.module else spec.prefix,
                env=self.env(**spec.env),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pids[key] = proc.pid
        self.procs[key] = proc
        return proc.pid

    def plan_services(self, replicas: int | Mapping[str, int] = 1) -> list[str]:
        """Record how to start every service: `replicas` of each (an int: of every
        service, the launcher's replicas sharing the jobs by shard lease; a mapping:
        per service, 1 for the others), each replica its own process, `name`,
        `name-1`, ..., with its MUSTER_INSTANCE."""
        keys = []
        for name in SERVICES:
            count = replicas_of(name, replicas)
            for i in range(count):
                key = name if i == 0 else f"{name}-{i}"
                env = {"MUSTER_INSTANCE": str(i), **metrics_port()}
                self.specs[key] = ProcSpec(f"services.{name}", env)
                keys.append(key)
        return keys

    def plan_gateway(self, port: int = 0) -> str:
        """Record how to start the gateway (services.gateway) on 127.0.0.1:`port` (0:
        GATEWAY_PORT if free, else any port free now); its URL, also kept in the state
        file as `http`."""
        port = port or free_port(GATEWAY_PORT)
        env = {"MUSTER_HTTP_PORT": str(port), **metrics_port()}
        self.specs["gateway"] = ProcSpec("services.gateway", env)
        self.http = f"http://127.0.0.1:{port}"
        return "gateway"

    def start_services(self, replicas: int | Mapping[str, int] = 1) -> None:
        for key in self.plan_services(replicas):
            self.respawn(key)

    def plan_node(self, node: NodeDef, prefix: Sequence[str] = (), **extra: str) -> str:
        key = f"node-{node.name}"
        env = {
            "MUSTER_NODE": node.name,
            "MUSTER_GPUS": str(node.gpus),
            "MUSTER_GPU_MODEL": node.gpu_model,
            "MUSTER_TOPOLOGY": "/".join(node.topology),
            "MUSTER_FEATURES": ",".join(node.features),
            **({"MUSTER_FABRIC": ",".join(node.fabric)} if node.fabric else {}),
            **metrics_port(),
            **extra,
        }
        self.specs[key] = ProcSpec("muster.node", env, tuple(prefix))
        if node.name not in self.nodes:
            self.nodes.append(node.name)
        return key

    def start_node(self, node: NodeDef, prefix: Sequence[str] = (), **extra: str) -> None:
        self.respawn(self.plan_node(node, prefix, **extra))

    def metrics_endpoints(self) -> dict[str, str]:
        """Each process's /metrics URL: the port planned for it, or the one it wrote to
        `<state>/metrics/<key>.url` once it bound (another, if its port was taken)."""
        urls = {}
        for key, spec in self.specs.items():
            port = spec.env.get("MUSTER_METRICS_PORT", "")
            if port.isdigit() and int(port) > 0:
                host = spec.env.get("MUSTER_METRICS_HOST", "127.0.0.1")
                urls[key] = f"http://{host}:{port}/metrics"
        bound = read_endpoints(self.state_dir)
        urls.update({k: v for k, v in bound.items() if k in self.specs})
        return urls

    def kill(self, key: str, sig: int = signal.SIGTERM) -> None:
        pid = self.pids.get(key)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop in order, each stage gone before the next, so nothing is restarted and
        nothing loses its servers while it still runs: the supervisor, the node agents
        (then every job worker recorded under the state folder), the services, and NATS
        and PostgreSQL last."""
        if "supervisor" in self.pids:
            self._stop_stage(["supervisor"], timeout)
            with contextlib.suppress(FileNotFoundError):
                self.pids = Cluster.load(self.state_dir).pids  # its last restarts
        keys = [k for k in self.pids if k != "supervisor"]
        nodes = [k for k in keys if k.startswith("node-")]
        servers = [k for k in keys if k.startswith("server-")]
        self._stop_stage(nodes, timeout)
        stop_recorded_workers(self.state_dir, grace_s=min(timeout, 5.0))
        self._stop_stage([k for k in keys if k not in nodes and k not in servers], timeout)
        self._stop_stage(servers, timeout)

    def _stop_stage(self, keys: list[str], timeout: float) -> None:
        for key in keys:
            # PostgreSQL's fast shutdown (SIGINT) ends its sessions instead of waiting.
            self.kill(key, signal.SIGINT if key == "server-postgres" else signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for key in keys:
            pid = self.pids[key]
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            # Each process leads its own session: what it left behind goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def free_port(preferred: int = 0) -> int:
    """`preferred` if nothing listens there on 127.0.0.1, else a port free now that a
    restart finds free again (`shared.ports.listen_port`)."""
    if preferred and ports.bindable(preferred):
        return preferred
    return embedded.free_port()


def metrics_port() -> dict[str, str]:
    """A /metrics port of its own for a process we plan (MUSTER_METRICS_PORT), chosen
    now, so its URL is in the state file before it starts and stays across restarts
    (a Prometheus target that does not move); none when metrics are off (-1)."""
    if os.environ.get("MUSTER_METRICS_PORT", "0").strip() == "-1":
        return {}
    return {"MUSTER_METRICS_PORT": str(embedded.free_port())}


def replicas_of(service: str, replicas: int | Mapping[str, int]) -> int:
    """How many replicas of `service` to run when asked for `replicas`."""
    if isinstance(replicas, Mapping):
        return max(1, replicas.get(service, 1))
    return max(1, replicas)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return not _zombie(pid)  # not our child: it runs, unless only its exit status is left
    return waited == 0


def _zombie(pid: int) -> bool:
    """An exited process its parent has not reaped yet (an orphan waits on init for
    that, and some containers' init never reaps): it runs nothing."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone meanwhile
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def up(
    state_dir: Path,
    topology: Path,
    *,
    fast: bool = False,
    wait_s: float = 60.0,
    replicas: int = 1,
    nats_servers: int = 1,
    secure: bool = True,
    tls: bool = False,
) -> Cluster:
    """Start servers (unless MUSTER_NATS_URL / MUSTER_DATABASE_URL name running ones;
    `nats_servers` 3: a JetStream cluster, the streams at R3), then the supervisor
    (`muster.supervisor`), which starts `replicas` of every service and every node of
    `topology` and keeps them running; returns once cluster.json lists them. `secure`:
    the servers we start have least privilege (muster.secure_up); `tls`: TLS, verified
    against a CA of the cluster's own, on NATS (clients and routes) and PostgreSQL."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(state_dir / METRICS_FOLDER, ignore_errors=True)  # a last run's /metrics URLs
    nodes = load_topology(topology)
    sec = LocalSecurity.make(state_dir, [n.name for n in nodes], tls=tls) if secure else None
    nats_config = sec.nats_config() if sec else ""
    pids: dict[str, int] = {}
    servers: dict[str, tuple[str, ...]] = {}  # restarted by the supervisor if they exit
    nats_url = os.environ.get("MUSTER_NATS_URL")
    stream_replicas = int(os.environ.get("MUSTER_STREAM_REPLICAS", "1"))
    if not nats_url and nats_servers > 1:
        route_tls = sec.route_tls() if sec else ""  # `tls`: routes verified by the CA
        nc = embedded.start_nats_cluster(
            state_dir, nats_servers, config=nats_config, cluster_tls=route_tls
        )
        nats_url, stream_replicas = nc.url, min(nats_servers, 3)  # JetStream's most
        pids.update({f"server-nats-{i}": s.process.pid for i, s in enumerate(nc.servers)})
        servers = {f"server-nats-{i}": command for i, command in enumerate(nc.commands())}
    elif not nats_url:
        nats = embedded.start_nats(state_dir, config=nats_config)
        nats_url, pids["server-nats"] = nats.url, nats.process.pid
    db_url = os.environ.get("MUSTER_DATABASE_URL")
    pg_url = ""  # the server we start, whose roles are ours to make
    if not db_url:
        password = sec.pg_password if sec else ""
        pg_tls = sec.tls if sec else None  # `tls`: TCP logins over TLS only
        pg = embedded.start_postgres(state_dir, fast=fast, password=password, tls=pg_tls)
        ca = sec.pg_ca if sec else ""
        db_url = embedded.create_database(pg.url, "muster", password=password, ca=ca)
        pids["server-postgres"] = pg.process.pid
        if sec:
            pg_url, db_url = pg.url, sec.prepare_database(pg.url, "muster")
    cluster = Cluster(state_dir, nats_url, db_url, pids, stream_replicas=stream_replicas)
    os.environ.setdefault("MUSTER_CLUSTER_CONFIG", str(DEFAULT_CLUSTER_CONFIG))
    cluster.plan_services(replicas)
    cluster.plan_gateway(int(os.environ.get("MUSTER_HTTP_PORT", "0")))
    for key, command in servers.items():
        cluster.specs[key] = ProcSpec("", {}, command)
    for node in nodes:
        cluster.plan_node(node)
    if sec and not os.environ.get("MUSTER_NATS_URL"):
        sec.apply(cluster.specs, pg_url, "muster")
    cluster.save()
    cluster.spawn("supervisor", "muster.supervisor")
    return _supervised(cluster, wait_s)


def _supervised(cluster: Cluster, wait_s: float) -> Cluster:
    """The state file once the supervisor has written its own pid and started every
    process it was given."""
    deadline = time.monotonic() + wait_s
    proc = cluster.procs["supervisor"]
    while time.monotonic() < deadline and proc.poll() is None:
        seen = Cluster.load(cluster.state_dir)
        if "supervisor" in seen.pids and set(cluster.specs) <= set(seen.pids):
            seen.specs["supervisor"] = cluster.specs["supervisor"]
            return seen
        time.sleep(0.1)
    raise RuntimeError(f"the supervisor did not start the cluster; see {cluster.state_dir}/logs")


def down(state_dir: Path) -> Cluster:
    cluster = Cluster.load(state_dir.resolve())
    cluster.stop_all()
    cluster.state_file.unlink(missing_ok=True)
    return cluster
