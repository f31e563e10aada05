"""Pure plumbing for config.py: cross-references between sections of a parsed config.

Each check records a problem on the key that holds the bad reference and lists what
that key could name instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from .config_model import ClusterConfig
from .config_read import Problems


def _names(items: Iterable[object]) -> str:
    return ", ".join(str(n) for n in items) or "none defined"


def check_references(c: ClusterConfig, p: Problems) -> None:
    if c.partitions and c.default_partition not in c.partitions:
        p.add(
            "cluster.default_partition",
            f"no partition {c.default_partition!r}; defined: {_names(c.partitions)}",
        )
    if c.default_qos not in c.qos:
        p.add("cluster.default_qos", f"no QOS {c.default_qos!r}; defined: {_names(c.qos)}")
    _check_partitions(c, p)
    _check_qos(c, p)
    _check_accounts(c, p)
    _check_users(c, p)


def _check_partitions(c: ClusterConfig, p: Problems) -> None:
    for name, part in c.partitions.items():
        key = f"partitions.{name}"
        if part.max_time_s is not None and part.default_time_s > part.max_time_s:
            p.add(f"{key}.default_time", "is longer than max_time; make it max_time or less")
        for target in part.can_preempt:
            if target not in c.partitions:
                p.add(
                    f"{key}.can_preempt",
                    f"no partition {target!r}; defined: {_names(c.partitions)}",
                )
            elif target == name:
                p.add(f"{key}.can_preempt", "a partition cannot preempt itself")
        for account in part.allowed_accounts:
            if c.accounts and account not in c.accounts:
                p.add(
                    f"{key}.allowed_accounts",
                    f"no account {account!r}; defined: {_names(c.accounts)}",
                )
        for qos in (*part.allowed_qos, *([part.default_qos] if part.default_qos else [])):
            if qos not in c.qos:
                p.add(f"{key}.allowed_qos", f"no QOS {qos!r}; defined: {_names(c.qos)}")
        if part.node_names == ():
            p.add(f"{key}.nodes", "names no node; give ALL, a node_sets label or a hostlist")
        if part.def_mem_per_gpu_mib and part.def_mem_per_cpu_mib:
            p.add(f"{key}.def_mem_per_cpu", "give one of def_mem_per_gpu and def_mem_per_cpu")


def _check_qos(c: ClusterConfig, p: Problems) -> None:
    for name, qos in c.qos.items():
        for target in qos.preempt:
            if target not in c.qos:
                p.add(f"qos.{name}.preempt", f"no QOS {target!r}; defined: {_names(c.qos)}")
            elif target == name:
                p.add(f"qos.{name}.preempt", "a QOS cannot preempt itself")


def _check_accounts(c: ClusterConfig, p: Problems) -> None:
    roots = [a.name for a in c.accounts.values() if a.parent is None]
    if c.accounts and len(roots) != 1:
        p.add(
            "accounts",
            f"the account tree needs exactly one root (an account without parent); "
            f"found {_names(roots)}",
        )
    for name, account in c.accounts.items():
        if account.parent is not None and account.parent not in c.accounts:
            p.add(
                f"accounts.{name}.parent",
                f"no account {account.parent!r}; defined: {_names(c.accounts)}",
            )
            continue
        seen = {name}
        parent = account.parent
        while parent is not None and parent in c.accounts:
            if parent in seen:
                p.add(f"accounts.{name}.parent", "the parents form a loop; the tree needs a root")
                break
            seen.add(parent)
            parent = c.accounts[parent].parent


def _check_users(c: ClusterConfig, p: Problems) -> None:
    for name, user in c.users.items():
        for account in user.accounts:
            if account not in c.accounts:
                p.add(
                    f"users.{name}.accounts",
                    f"no account {account!r}; defined: {_names(c.accounts)}",
                )
        if user.accounts and user.default_account not in user.accounts:
            p.add(
                f"users.{name}.default_account",
                f"{user.default_account!r} is not one of this user's accounts: "
                f"{_names(user.accounts)}",
            )
