"""Pure core of the fairshare service: the share table (what `muster share` prints).

`compute_shares(tree, usage, config)` turns the account tree and decayed usage into one
`ShareRow` per association (root, accounts, users) in tree order, with the fair-share
factor of every user under the configured algorithm (Fair Tree or classic). No I/O, no
clock: the shell loads the tree and usage, calls this, and stores or publishes rows.

The other pure parts live beside it: `accounting` (exactly-once charging), `decay`
(half-life and reset periods), `priority` (multifactor), `calculator` (a cached hook
for the placer and the simulator) and `render` (text tables).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

import msgspec

from services.fairshare import classic as classic_algo
from services.fairshare import fairtree
from services.fairshare.tree import AccountTree, Assoc, Node, build, roll_up, walk


class FairShareAlgorithm(StrEnum):
    FAIR_TREE = "fair_tree"  # Slurm's default since 19.05
    CLASSIC = "classic"  # Slurm's PriorityFlags=NO_FAIR_TREE


class ShareOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fair-share part of the configuration."""

    algorithm: FairShareAlgorithm = FairShareAlgorithm.FAIR_TREE
    dampening: Annotated[float, msgspec.Meta(gt=0)] = 1.0  # classic only
    usage_total: float | None = None  # classic only: normaliser; None = root's usage


class ShareRow(msgspec.Struct, frozen=True, kw_only=True):
    """One association of the share table; field names are the `--json` contract.

    Under fair_tree, `norm_shares` and `effective_usage` are relative to siblings and
    `level_fs` is S/U (infinite, JSON null, with no usage); accounts have no fairshare.
    Under classic, `norm_shares` is the share of the whole machine, `effective_usage`
    is Slurm's UE, `level_fs` is null and accounts have a fairshare too.
    """

    account: str
    user: str | None = None
    depth: int  # 0 root, 1 directly under root, ...
    raw_shares: int
    norm_shares: float
    raw_usage: float  # decayed billed GPU-seconds, rolled up the tree
    norm_usage: float  # raw_usage / root's raw_usage
    effective_usage: float
    level_fs: float | None = None
    fairshare: float | None = None
    rank: int | None = None  # fair_tree users: N for the best, 1 for the worst


class ShareTable(msgspec.Struct, frozen=True, kw_only=True):
    algorithm: FairShareAlgorithm
    users: int
    rows: tuple[ShareRow, ...]
    # rank a user without an association would get in each account (fair_tree),
    # or the account's factor (classic); used by the calculator for newcomers
    newcomer_factor: dict[str, float] = {}


def compute_shares(
    tree: AccountTree | Node,
    usage: Mapping[Assoc, float],
    options: ShareOptions | None = None,
) -> ShareTable:
    """The share table for a tree and decayed usage (keyed by user or account assoc)."""
    opts = options or ShareOptions()
    root = tree if isinstance(tree, Node) else build(tree)
    raw = roll_up(root, usage)
    if opts.algorithm == FairShareAlgorithm.CLASSIC:
        return _classic_table(root, raw, opts)
    return _fair_tree_table(root, raw)


def _root_row(root: Node, raw: Mapping[Assoc, float], total: float | None = None) -> ShareRow:
    used = raw.get(root.assoc, 0.0)
    norm = used / total if total else (1.0 if used > 0.0 else 0.0)
    return ShareRow(
        account=root.assoc.account,
        depth=0,
        raw_shares=root.shares,
        norm_shares=1.0,
        raw_usage=used,
        norm_usage=norm,
        effective_usage=norm,
    )


def _norm_usage(raw: Mapping[Assoc, float], root: Node, assoc: Assoc) -> float:
    total = raw.get(root.assoc, 0.0)
    return raw.get(assoc, 0.0) / total if total > 0.0 else 0.0


def _fair_tree_table(root: Node, raw: Mapping[Assoc, float]) -> ShareTable:
    level = fairtree.levels(root, raw)
    ranking = fairtree.rank(root, level)
    rows = [_root_row(root, raw)]
    for node in walk(root):
        if node is root:
            continue
        lv = level[node.assoc]
        user_rank = ranking.user_rank.get(node.assoc) if node.is_user else None
        rows.append(
            ShareRow(
                account=node.assoc.account,
                user=node.assoc.user or None,
                depth=node.depth,
                raw_shares=node.shares,
                norm_shares=lv.norm_shares,
                raw_usage=raw.get(node.assoc, 0.0),
                norm_usage=_norm_usage(raw, root, node.assoc),
                effective_usage=lv.effective_usage,
                level_fs=lv.level_fs,
                fairshare=ranking.factor(node.assoc) if node.is_user else None,
                rank=user_rank,
            )
        )
    users = ranking.users
    newcomer = {a: (r / users if users else 1.0) for a, r in ranking.entry_rank.items()}
    return ShareTable(
        algorithm=FairShareAlgorithm.FAIR_TREE,
        users=users,
        rows=tuple(rows),
        newcomer_factor=newcomer,
    )


def _classic_table(root: Node, raw: Mapping[Assoc, float], opts: ShareOptions) -> ShareTable:
    values = classic_algo.classic(root, raw, usage_total=opts.usage_total, dampening=opts.dampening)
    rows = [_root_row(root, raw, opts.usage_total)]
    newcomer = {root.assoc.account: 1.0}
    users = 0
    for node in walk(root):
        if node is root:
            continue
        cv = values[node.assoc]
        users += node.is_user
        if not node.is_user:
            newcomer[node.assoc.account] = cv.fairshare
        rows.append(
            ShareRow(
                account=node.assoc.account,
                user=node.assoc.user or None,
                depth=node.depth,
                raw_shares=node.shares,
                norm_shares=cv.norm_shares,
                raw_usage=raw.get(node.assoc, 0.0),
                norm_usage=cv.norm_usage,
                effective_usage=cv.effective_usage,
                fairshare=cv.fairshare,
            )
        )
    return ShareTable(
        algorithm=FairShareAlgorithm.CLASSIC,
        users=users,
        rows=tuple(rows),
        newcomer_factor=newcomer,
    )


def user_factors(table: ShareTable) -> dict[Assoc, float]:
    """Fair-share factor of every user association in a table."""
    return {
        Assoc(r.account, r.user): r.fairshare
        for r in table.rows
        if r.user is not None and r.fairshare is not None
    }
