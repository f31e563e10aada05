"""Pure core: the parts of the cluster configuration (TOML) fair share needs.

The account tree (`[accounts.*]` with `parent` and `shares`, `[users.*]` with their
`accounts`), billing weights per GPU model (`[billing]`) and the QOS and partition
priorities (`[qos.*].priority`, `[partitions.*].priority_tier`). Admission validates the
whole file; this reads only these tables and ignores the rest, so the two services
share a file but no code. An account named `root` is the tree's implicit root.
"""

from __future__ import annotations

import tomllib
from typing import Any

import msgspec

from services.fairshare.tree import ROOT, Account, AccountTree, UserAssoc


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    name: str = "muster"  # `[cluster] name`: sreport's Cluster column
    tree: AccountTree = AccountTree()
    billing_weights: dict[str, float] = {}
    qos_priorities: dict[str, int] = {}
    partition_priorities: dict[str, int] = {}


def _tables(doc: dict[str, Any], key: str) -> dict[str, dict[str, Any]]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, dict)}


def read_cluster(text: str) -> ClusterView:
    """The fair-share view of a cluster configuration; raises ValueError on bad TOML."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"cluster configuration is not valid TOML: {err}") from err
    accounts = tuple(
        Account(
            name=name,
            parent=None if body.get("parent") in (None, ROOT) else str(body["parent"]),
            shares=int(body.get("shares", 1)),
        )
        for name, body in _tables(doc, "accounts").items()
        if name != ROOT
    )
    users = tuple(
        UserAssoc(user=name, account=str(account), shares=int(body.get("shares", 1)))
        for name, body in _tables(doc, "users").items()
        for account in body.get("accounts", ())
    )
    billing = doc.get("billing", {})
    weights = billing.get("gpu_weights", {}) if isinstance(billing, dict) else {}
    cluster = doc.get("cluster", {})
    name = cluster.get("name", "muster") if isinstance(cluster, dict) else "muster"
    return ClusterView(
        name=str(name),
        tree=AccountTree(accounts=accounts, users=users),
        billing_weights={str(k): float(v) for k, v in weights.items()},
        qos_priorities={
            name: int(body.get("priority", 0)) for name, body in _tables(doc, "qos").items()
        },
        partition_priorities={
            name: int(body.get("priority_tier", 0))
            for name, body in _tables(doc, "partitions").items()
        },
    )
