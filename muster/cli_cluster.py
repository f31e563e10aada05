"""Shell: the cluster commands of `muster` — the local cluster (`up`, `down`, `demo`)
and the nodes (`nodes`, `drain`, `resume`, `inject-fault`); `muster.cli` calls
`register_local` and
`register_nodes` with its subparsers. What they print is `muster.render`'s."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from muster import render
from muster.client import ApiRefused, current_user, nats_url, refused, register_cluster, request
from shared.api import AgentReply, InjectFault, NodeAction, NodesReply, Ok, QueueRequest
from shared.states import NodeState

if TYPE_CHECKING:
    from muster.cluster import Cluster

# The local cluster's machinery (muster.cluster: the supervisor, servers, the database)
# is imported by the commands that start or stop it, not by every `muster` call.
DEFAULT_TOPOLOGY = Path(__file__).resolve().parent.parent / "deploy" / "local" / "topology.toml"


def _no_runtime_dir_warning() -> None:
    """platformdirs (under the embedded PostgreSQL, as it is imported) warns when a
    shell has no XDG_RUNTIME_DIR (sudo, ssh without a session, a container) and uses
    /tmp: nothing the user must act on, and nothing `muster up` keeps there."""
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


def cmd_up(args: argparse.Namespace) -> int:
    _no_runtime_dir_warning()
    from muster import cluster as local

    state = Path(args.state)
    if (state / "cluster.json").exists():
        print(f"a cluster is already up in {state}; `muster down` first", file=sys.stderr)
        return 1
    keys = provision_local_users(state)
    try:
        c = local.up(
            state,
            Path(args.topology),
            replicas=args.replicas,
            nats_servers=args.nats_servers,
            secure=not args.insecure,
            tls=args.tls,
        )
    except RuntimeError as err:  # the supervisor did not start: its log says why
        print(f"{err}; `muster down` stops what did start", file=sys.stderr)
        return 1
    register_cluster(c.nats_url, c.state_dir)  # the wait below connects as a user
    services = ", ".join(
        f"{name} x{local.replicas_of(name, args.replicas)}" for name in local.SERVICES
    )
    print(f"muster is up: {len(c.nodes)} nodes, services {services}")
    print(f"  supervised (restarted if they exit) by pid {c.pids['supervisor']}")
    print(f"  state and logs: {c.state_dir} (logs/ has one file per process)")
    print(f"  NATS: {c.nats_url}   PostgreSQL: {c.database_url}")
    print("  metrics (Prometheus /metrics, also in cluster.json):")
    for key, url in sorted(c.metrics_endpoints().items()):
        print(f"    {key}: {url}")
    who = os.environ.get("MUSTER_USER") or getpass.getuser()
    print(f"  dashboard and REST API: {c.http} (acting as {who}; docs/dashboard.md)")
    print(f"  users' keys: {keys} (act as one with MUSTER_USER=NAME)")
    return _wait_for_nodes(c, len(c.nodes), args.wait)


def provision_local_users(state: Path) -> Path:
    """A local cluster's users: a key for you and for each user of its configuration in
    `state/keys`, registered with the services it starts (MUSTER_USER_KEYS_DIR)."""
    import tomllib

    from muster import cluster as local
    from shared.identity_files import provision_keys

    config = Path(os.environ.get("MUSTER_CLUSTER_CONFIG") or local.DEFAULT_CLUSTER_CONFIG)
    users = tuple(tomllib.loads(config.read_text()).get("users", {}))
    keys = (state / "keys").resolve()
    provision_keys(str(keys), tuple(dict.fromkeys((getpass.getuser(), *users))))
    # The services honour these keys; this process (the demo, the wait for nodes) signs
    # with them.
    os.environ.update(MUSTER_USER_KEYS_DIR=str(keys), MUSTER_KEY_DIR=str(keys))
    return keys


def _wait_for_nodes(c: Cluster, want: int, timeout: float) -> int:
    from shared.transient import is_transient

    deadline = time.monotonic() + timeout
    url = c.nats_url
    while time.monotonic() < deadline:
        try:
            reply = request(url, "nodes", QueueRequest(user=current_user()), NodesReply, 3)
            up = [n for n in reply.nodes if n.state == NodeState.UP]
            if len(up) >= want:
                print(f"  {len(up)} nodes UP, {sum(n.gpus_total for n in up)} GPUs")
                return 0
        except Exception as err:
            if not (is_transient(err) or isinstance(err, ApiRefused)):
                raise  # a bug, not services still starting (no responders, unavailable)
        time.sleep(0.5)
    print("the cluster did not come up in time; see the logs", file=sys.stderr)
    return 1


def cmd_down(args: argparse.Namespace) -> int:
    from muster import cluster as local

    state = Path(args.state)
    if not (state / "cluster.json").exists():
        print(f"no cluster in {state}", file=sys.stderr)
        return 1
    local.down(state)
    print("muster is down: supervisor, node agents, job workers, services and servers")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    _no_runtime_dir_warning()
    from muster.demo import run_demo

    provision_local_users(Path(args.state))
    return run_demo(Path(args.state), Path(args.topology))


def cmd_nodes(args: argparse.Namespace) -> int:
    reply = request(nats_url(args.state), "nodes", QueueRequest(user=current_user()), NodesReply)
    print(render.to_json(reply) if args.json else "\n".join(render.nodes_lines(reply)))
    return 0


def _node_action(verb: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        req = NodeAction(user=current_user(), node=args.node, reason=args.reason or "")
        try:
            reply = request(nats_url(args.state), verb, req, Ok)
        except ApiRefused as err:
            return refused(verb, err)
        print(reply.message)
        return 0

    return run


def cmd_inject(args: argparse.Namespace) -> int:
    body = InjectFault(gpu=args.gpu, xid=args.xid, lose_gpu=args.lose)
    import asyncio

    from muster.client import agent

    raw = asyncio.run(agent(nats_url(args.state), args.node, "inject", body))
    reply = msgspec.json.decode(raw, type=AgentReply)
    print(("injected " if reply.ok else "refused: ") + reply.message)
    return 0 if reply.ok else 1


def register_local(sub: Any) -> None:
    """Add `up`, `down` and `demo` to the `muster` parser's subcommands."""
    s = sub.add_parser("up", help="start a local cluster")
    s.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    s.add_argument("--wait", type=float, default=60.0)
    s.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="processes of every service (the launcher: one, until it shares jobs)",
    )
    s.add_argument(
        "--nats-servers",
        type=int,
        default=1,
        choices=(1, 3),
        help="3: a JetStream cluster on the loopback, the streams kept on all three",
    )
    s.add_argument(
        "--insecure",
        action="store_true",
        help="no bus permissions, trust logins to PostgreSQL (docs/security.md)",
    )
    s.add_argument("--tls", action="store_true", help="TLS on the bus, with a CA of its own")
    s.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop the local cluster").set_defaults(fn=cmd_down)
    s = sub.add_parser("demo", help="up, run a demo workload with a GPU fault, down")
    s.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    s.set_defaults(fn=cmd_demo)


def register_nodes(sub: Any) -> None:
    """Add `nodes`, `drain`, `resume` and `inject-fault`."""
    s = sub.add_parser("nodes", help="list nodes and GPU health")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_nodes)
    for verb in ("drain", "resume"):
        s = sub.add_parser(verb, help=f"{verb} a node (operators)")
        s.add_argument("node")
        s.add_argument("--reason", required=True)
        s.set_defaults(fn=_node_action(verb))

    s = sub.add_parser("inject-fault", help="inject a GPU XID on a simulated node")
    s.add_argument("node")
    s.add_argument("--gpu", type=int, default=0)
    s.add_argument("--xid", type=int, default=79)
    s.add_argument("--lose", action="store_true", help="the GPU falls off the bus")
    s.set_defaults(fn=cmd_inject)
