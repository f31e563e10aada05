"""Shell: a whole local cluster as processes — embedded NATS and PostgreSQL, every
service, one agent per simulated node — started into a state folder (`muster up`) and
stopped from it (`muster down`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from shared import embedded

SERVICES = ("admission", "placer", "launcher", "health", "fairshare")
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


def load_topology(path: Path) -> list[NodeDef]:
    """Read a topology file (see deploy/local/topology.toml); errors name the key."""
    data = tomllib.loads(path.read_text())
    gpus = int(data.get("gpus_per_node", 4))
    model = str(data.get("gpu_model", "SIM-H100"))
    nodes: list[NodeDef] = []
    for leaf in data.get("leaf", []):
        if "name" not in leaf or "nodes" not in leaf:
            raise ValueError(f"{path}: every [[leaf]] needs 'name' and 'nodes'")
        path_ = tuple(p for p in (leaf.get("spine"), leaf["name"]) if p)
        for name in leaf["nodes"]:
            nodes.append(NodeDef(name, int(leaf.get("gpus_per_node", gpus)), model, path_))
    if not nodes:
        raise ValueError(f"{path}: no nodes; add a [[leaf]] with nodes = [...]")
    return nodes


@dataclass
class Cluster:
    state_dir: Path
    nats_url: str
    database_url: str
    pids: dict[str, int] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)

    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def save(self) -> None:
        self.state_file.write_text(
            json.dumps(
                {
                    "nats_url": self.nats_url,
                    "database_url": self.database_url,
                    "pids": self.pids,
                    "nodes": self.nodes,
                },
                indent=2,
            )
        )

    @classmethod
    def load(cls, state_dir: Path) -> Cluster:
        data = json.loads((state_dir / "cluster.json").read_text())
        return cls(state_dir, data["nats_url"], data["database_url"], data["pids"], data["nodes"])

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        # A local cluster runs your jobs as you, even when you are root (a container);
        # a real node agent refuses root jobs unless MUSTER_ALLOW_ROOT_JOBS says so.
        env.setdefault("MUSTER_ALLOW_ROOT_JOBS", "true")
        env.update(
            MUSTER_NATS_URL=self.nats_url,
            MUSTER_DATABASE_URL=self.database_url,
            MUSTER_STATE_DIR=str(self.state_dir),
        )
        env.update(extra)
        return env

    def spawn(self, key: str, module: str, **extra: str) -> int:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / f"{key}.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module],
                env=self.env(**extra),
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pids[key] = proc.pid
        return proc.pid

    def start_services(self, replicas: int = 1) -> None:
        for name in SERVICES:
            for i in range(replicas if name == "admission" else 1):
                key = name if i == 0 else f"{name}-{i}"
                self.spawn(key, f"services.{name}", MUSTER_INSTANCE=str(i))

    def start_node(self, node: NodeDef, **extra: str) -> None:
        self.spawn(
            f"node-{node.name}",
            "muster.node",
            MUSTER_NODE=node.name,
            MUSTER_GPUS=str(node.gpus),
            MUSTER_GPU_MODEL=node.gpu_model,
            MUSTER_TOPOLOGY="/".join(node.topology),
            **extra,
        )
        if node.name not in self.nodes:
            self.nodes.append(node.name)

    def kill(self, key: str, sig: int = signal.SIGTERM) -> None:
        pid = self.pids.get(key)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop_all(self, timeout: float = 15.0) -> None:
        for key in sorted(
            self.pids, key=lambda k: (k.startswith("node-"), k.startswith("server-"))
        ):
            self.kill(key)
        deadline = time.monotonic() + timeout
        for key, pid in list(self.pids.items()):
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                self.kill(key, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not our child: it exists
    return waited == 0


def up(state_dir: Path, topology: Path, *, fast: bool = False) -> Cluster:
    """Start servers (unless MUSTER_NATS_URL / MUSTER_DATABASE_URL name running ones),
    every service and every node of `topology`."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    nodes = load_topology(topology)
    pids: dict[str, int] = {}
    nats_url = os.environ.get("MUSTER_NATS_URL")
    if not nats_url:
        nats = embedded.start_nats(state_dir)
        nats_url, pids["server-nats"] = nats.url, nats.process.pid
    db_url = os.environ.get("MUSTER_DATABASE_URL")
    if not db_url:
        pg = embedded.start_postgres(state_dir, fast=fast)
        db_url = embedded.create_database(pg.url, "muster")
        pids["server-postgres"] = pg.process.pid
    cluster = Cluster(state_dir, nats_url, db_url, pids)
    os.environ.setdefault("MUSTER_CLUSTER_CONFIG", str(DEFAULT_CLUSTER_CONFIG))
    cluster.start_services()
    for node in nodes:
        cluster.start_node(node)
    cluster.save()
    return cluster


def down(state_dir: Path) -> Cluster:
    cluster = Cluster.load(state_dir.resolve())
    cluster.stop_all()
    cluster.state_file.unlink(missing_ok=True)
    return cluster
