"""Pure core: Slurm's Fair Tree fair-share algorithm (the default).

For every association, among itself and its siblings (the children of one parent):

    S  = shares_self / shares_self+siblings        (normalized shares)
    U  = usage_self / usage_self+siblings          (effective usage; 0 if nobody used any)
    LF = S / U                                     (level fair share; inf when U == 0)

An association with zero shares has LF = 0. The tree is then visited depth-first with
siblings sorted by LF, highest first, and users are ranked in the order they are found:
the first gets rank N (N = number of user associations), the next N-1, and so on. A
user's fair-share factor is rank / N, so the best-served-least user gets 1.0.

Ties, as Slurm documents them: sibling users with equal LF share a rank; a user with
the same LF as a sibling account gets the rank of that account's highest ranked user;
sibling accounts with equal LF have their children merged before descending.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import groupby

import msgspec

from services.fairshare.tree import Assoc, Node, user_count


class Level(msgspec.Struct, frozen=True, kw_only=True):
    """The sibling-relative values of one association."""

    norm_shares: float
    effective_usage: float
    level_fs: float


class Ranking(msgspec.Struct, frozen=True, kw_only=True):
    """Ranks of user associations, and the rank a newcomer to each account would get."""

    users: int
    user_rank: dict[Assoc, int]
    entry_rank: dict[str, int]  # account -> counter value when the traversal entered it

    def factor(self, assoc: Assoc) -> float:
        return self.user_rank[assoc] / self.users if self.users else 0.0


def level_fair_share(norm_shares: float, effective_usage: float) -> float:
    if norm_shares <= 0.0:
        return 0.0
    if effective_usage <= 0.0:
        return math.inf
    return norm_shares / effective_usage


def levels(root: Node, raw_usage: Mapping[Assoc, float]) -> dict[Assoc, Level]:
    """S, U and LF for every association below root."""
    out: dict[Assoc, Level] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        shares = sum(c.shares for c in node.children)
        usage = sum(raw_usage.get(c.assoc, 0.0) for c in node.children)
        for child in node.children:
            s = child.shares / shares if shares else 0.0
            u = raw_usage.get(child.assoc, 0.0) / usage if usage > 0.0 else 0.0
            out[child.assoc] = Level(
                norm_shares=s, effective_usage=u, level_fs=level_fair_share(s, u)
            )
            stack.append(child)
    return out


def rank(root: Node, level: Mapping[Assoc, Level]) -> Ranking:
    """Rank every user association by a depth-first walk in descending LF order."""
    total = user_count(root)
    counter = total
    user_rank: dict[Assoc, int] = {}
    entry_rank: dict[str, int] = {root.assoc.account: total}

    def lf(node: Node) -> float:
        return level[node.assoc].level_fs

    def visit(children: list[Node]) -> None:
        nonlocal counter
        # sorted() is stable, so equal LFs keep configuration order (display only).
        for _, tied in groupby(sorted(children, key=lf, reverse=True), key=lf):
            group = list(tied)
            group_rank = counter
            accounts = [n for n in group if not n.is_user]
            for acct in accounts:
                entry_rank[acct.assoc.account] = counter
            if accounts:
                visit([c for acct in accounts for c in acct.children])
            for user in (n for n in group if n.is_user):
                user_rank[user.assoc] = group_rank
                counter -= 1

    visit(list(root.children))
    return Ranking(users=total, user_rank=user_rank, entry_rank=entry_rank)
