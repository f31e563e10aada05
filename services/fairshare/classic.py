"""Pure core: Slurm's classic fair-share algorithm (`PriorityFlags=NO_FAIR_TREE`).

    S   = product down the path of shares / sibling shares   (share of the whole machine)
    U   = usage / total usage                                 (normalized usage)
    UE  = U                                        for the tier directly under root
    UE  = U + (UE_parent - U) * S_child / S_all_siblings     below it (raw share ratio)
    F   = 2 ** (-UE / S / d)                       (d: dampening factor, default 1)

An association with no shares gets F = 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from services.fairshare.tree import Assoc, Node


class Classic(msgspec.Struct, frozen=True, kw_only=True):
    norm_shares: float
    norm_usage: float
    effective_usage: float
    fairshare: float


def classic_factor(effective_usage: float, norm_shares: float, dampening: float = 1.0) -> float:
    if norm_shares <= 0.0:
        return 0.0
    return float(2.0 ** (-effective_usage / norm_shares / dampening))


def classic(
    root: Node,
    raw_usage: Mapping[Assoc, float],
    *,
    usage_total: float | None = None,
    dampening: float = 1.0,
) -> dict[Assoc, Classic]:
    """Classic values for every association below root.

    `usage_total` normalises usage; by default it is root's rolled-up usage, as Slurm
    does. Pass the machine's capacity to read usage as a fraction of the machine.
    """
    total = raw_usage.get(root.assoc, 0.0) if usage_total is None else usage_total
    out: dict[Assoc, Classic] = {}

    def visit(node: Node, parent_shares: float, parent_ue: float) -> None:
        siblings = sum(c.shares for c in node.children)
        for child in node.children:
            ratio = child.shares / siblings if siblings else 0.0
            s = parent_shares * ratio
            u = raw_usage.get(child.assoc, 0.0) / total if total > 0.0 else 0.0
            ue = u if node is root else u + (parent_ue - u) * ratio
            out[child.assoc] = Classic(
                norm_shares=s,
                norm_usage=u,
                effective_usage=ue,
                fairshare=classic_factor(ue, s, dampening),
            )
            visit(child, s, ue)

    visit(root, 1.0, 0.0)
    return out
