"""Pure: the cluster configuration, one TOML file -> a validated `ClusterConfig`.

`load_config(text)` parses with tomllib and checks every key; an unknown key, a value of
the wrong kind or a reference to something undefined is reported with its dotted key
and what would be accepted. All problems are collected and raised together as one
`ConfigError`, so an operator fixes the file in one go. See docs/configuration.md.
"""

from __future__ import annotations

import tomllib

from . import config_read as r
from .config_check import check_references
from .config_fabric import fabric_links
from .config_io import io_policy
from .config_model import (
    Account,
    Billing,
    ClusterConfig,
    Limits,
    NodeTraits,
    Partition,
    PreemptMode,
    Qos,
    User,
)
from .config_read import ConfigProblem
from .config_reservations import reservation
from .hostlist import expand


class ConfigError(Exception):
    """The file is not a valid configuration; `problems` lists every fault found."""

    def __init__(self, problems: tuple[ConfigProblem, ...]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {p.key}: {p.message}" for p in problems)
        super().__init__(f"invalid cluster configuration ({len(problems)} problem(s)):\n{lines}")


TOP_KEYS = (
    "cluster",
    "node_sets",
    "partitions",
    "qos",
    "accounts",
    "users",
    "roles",
    "billing",
    "reservations",
    "limits",
)


def load_config(text: str) -> ClusterConfig:
    """Parse and check one TOML configuration; raises `ConfigError` naming each bad key."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError((ConfigProblem("<file>", f"not valid TOML: {err}"),)) from err
    p = r.Problems()
    r.unknown_keys(doc, "", TOP_KEYS, p)
    cluster = r.fields(r.table(doc, "cluster", p), "cluster", r.CLUSTER, p)
    node_sets, traits = _node_sets(r.table(doc, "node_sets", p), p)
    partitions = {
        name: _partition(name, body, node_sets, p)
        for name, body in r.named_tables(doc, "partitions", p).items()
    }
    qos = {name: _qos(name, body, p) for name, body in r.named_tables(doc, "qos", p).items()}
    if not qos:
        qos = {"normal": Qos(name="normal")}
    accounts = {
        name: _account(name, body, p) for name, body in r.named_tables(doc, "accounts", p).items()
    }
    users = {
        name: _user(name, body, bool(accounts), p)
        for name, body in r.named_tables(doc, "users", p).items()
    }
    limits = Limits(**r.fields(r.table(doc, "limits", p), "limits", r.LIMITS, p))
    roles = r.fields(r.table(doc, "roles", p), "roles", r.ROLES, p)
    billing = _billing(r.table(doc, "billing", p), p)
    windows = r.named_tables(doc, "reservations", p).items()
    reservations = {
        name: res
        for name, body in windows
        if (res := reservation(name, body, node_sets, p)) is not None
    }
    if not partitions and not _identity_only(doc):
        p.add("partitions", "define at least one partition, e.g. [partitions.normal]")
    config = ClusterConfig(
        name=str(cluster.get("name", "muster")),
        default_partition=str(cluster.get("default_partition") or next(iter(partitions), "")),
        default_qos=str(
            cluster.get("default_qos") or ("normal" if "normal" in qos else next(iter(qos)))
        ),
        max_array_index=int(cluster.get("max_array_index", 1000)),
        node_sets=node_sets,
        node_traits=traits,
        partitions=partitions,
        qos=qos,
        accounts=accounts,
        users=users,
        operators=tuple(roles.get("operators", ())),
        limits=limits,
        billing=billing,
        reservations=reservations,
    )
    check_references(config, p)
    _check_keys(users, p)
    if p.items:
        raise ConfigError(tuple(p.items))
    return config


IDENTITY_KEYS = frozenset({"cluster", "users", "roles", "limits"})


def _identity_only(doc: dict[str, object]) -> bool:
    """A file of users, keys and roles alone, no policy: valid without partitions
    (admission then checks jobs against the registered nodes only)."""
    return doc.keys() <= IDENTITY_KEYS and bool(doc.keys() & {"users", "roles"})


def _node_sets(
    body: dict[str, object], p: r.Problems
) -> tuple[dict[str, tuple[str, ...]], dict[str, NodeTraits]]:
    """`label = "node[01-04]"`, or a table `{nodes = ..., features = [...], gpu_type = ...,
    fabric = [...]}` whose features, GPU type and fabric links its nodes get (several
    sets' features, and fabric links, add up)."""
    sets: dict[str, tuple[str, ...]] = {}
    traits: dict[str, NodeTraits] = {}
    for label, value in body.items():
        key = f"node_sets.{label}"
        table = value if isinstance(value, dict) else {"nodes": value}
        r.unknown_keys(table, key, ("nodes", "features", "gpu_type", "fabric"), p)
        where = f"{key}.nodes" if isinstance(value, dict) else key
        exprs = r.str_list(table.get("nodes", []), where, p)
        sets[label] = _expand_all(exprs, key, {}, p) or ()
        features = r.str_list(table.get("features", []), f"{key}.features", p)
        gpu_type = (
            r.string(table["gpu_type"], f"{key}.gpu_type", p) if "gpu_type" in table else None
        )
        fabric = fabric_links(table.get("fabric", []), f"{key}.fabric", p)
        for node in sets[label] if features or gpu_type or fabric else ():
            had = traits.get(node, NodeTraits())
            traits[node] = NodeTraits(
                features=tuple(dict.fromkeys((*had.features, *features))),
                gpu_type=gpu_type.lower() if gpu_type else had.gpu_type,
                fabric=tuple(dict.fromkeys((*had.fabric, *fabric))),
            )
    return sets, traits


def _expand_all(
    exprs: tuple[str, ...], key: str, node_sets: dict[str, tuple[str, ...]], p: r.Problems
) -> tuple[str, ...] | None:
    names: dict[str, None] = {}
    for expr in exprs:
        if expr.upper() == "ALL":
            return None
        if expr in node_sets:
            names.update(dict.fromkeys(node_sets[expr]))
            continue
        try:
            names.update(dict.fromkeys(expand(expr)))
        except ValueError as err:
            known = ", ".join(node_sets) or "none defined"
            p.add(key, f"{err}; expected ALL, a node_sets label ({known}) or a hostlist")
    return tuple(names)


def _partition(
    name: str, body: dict[str, object], node_sets: dict[str, tuple[str, ...]], p: r.Problems
) -> Partition:
    key = f"partitions.{name}"
    f = r.fields(body, key, r.PARTITION, p)
    nodes = tuple(f.get("nodes", ("ALL",)))
    max_time = f.get("max_time")
    tiers = tuple(x for x in f.get("can_preempt", ()) if isinstance(x, int))
    return Partition(
        name=name,
        nodes=nodes,
        node_names=_expand_all(nodes, f"{key}.nodes", node_sets, p),
        default_time_s=int(f.get("default_time") or max_time or 3600),
        max_time_s=max_time,
        max_nodes=f.get("max_nodes"),
        max_gpus_per_job=f.get("max_gpus_per_job"),
        priority_tier=int(f.get("priority_tier", 0)),
        preempt_mode=PreemptMode(f.get("preempt_mode", "requeue")),
        grace_time_s=int(f.get("grace_time") or 0),
        allowed_accounts=tuple(f.get("allowed_accounts", ())),
        allowed_qos=tuple(f.get("allowed_qos", ())),
        default_qos=f.get("default_qos"),
        requires_approval=bool(f.get("requires_approval", False)),
        can_preempt=tuple(x for x in f.get("can_preempt", ()) if isinstance(x, str)),
        can_preempt_tiers=tiers,
        reserved_gpus=int(f.get("reserved_gpus", 0)),
        def_mem_per_gpu_mib=int(f.get("def_mem_per_gpu", 0)),
        def_mem_per_cpu_mib=int(f.get("def_mem_per_cpu", 0)),
        io=io_policy(f),
    )


def _qos(name: str, body: dict[str, object], p: r.Problems) -> Qos:
    f = r.fields(body, f"qos.{name}", r.QOS, p)
    limits = {k: v for k, v in f.items() if k.startswith("max_")}
    return Qos(
        name=name,
        priority=int(f.get("priority", 0)),
        min_runtime_s=int(f.get("min_runtime") or 0),
        preempt=tuple(f.get("preempt", ())),
        **limits,
    )


def _account(name: str, body: dict[str, object], p: r.Problems) -> Account:
    f = r.fields(body, f"accounts.{name}", r.ACCOUNT, p)
    return Account(
        name=name,
        parent=f.get("parent"),
        shares=int(f.get("shares", 1)),
        coordinators=tuple(f.get("coordinators", ())),
        description=str(f.get("description", "")),
        io=io_policy(f),
    )


def _user(name: str, body: dict[str, object], accounting: bool, p: r.Problems) -> User:
    """A user; without `[accounts]` (an identity-only file) a user needs no account."""
    f = r.fields(body, f"users.{name}", r.USER, p)
    accounts = tuple(f.get("accounts", ()))
    if not accounts and accounting:
        p.add(f"users.{name}.accounts", 'list at least one account, e.g. accounts = ["research"]')
    default = f.get("default_account") or (accounts[0] if accounts else "")
    return User(name=name, accounts=accounts, default_account=default, keys=f.get("keys", ()))


def _check_keys(users: dict[str, User], p: r.Problems) -> None:
    """A key acts as one user only: the same key under two users is refused."""
    owner: dict[str, str] = {}
    for name, user in users.items():
        for key in user.keys:
            if owner.setdefault(key, name) != name:
                p.add(f"users.{name}.keys", f"{key} is already {owner[key]!r}'s key")


def _billing(body: dict[str, object], p: r.Problems) -> Billing:
    f = r.fields(body, "billing", r.BILLING, p)
    weights = f.get("gpu_weights", {})
    return Billing(default_gpu_weight=float(f.get("default_gpu_weight", 1.0)), gpu_weights=weights)
