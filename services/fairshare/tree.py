"""Pure core: the account tree (associations, shares) and usage roll-up.

An association is an account, or a user inside an account, as in Slurm. Accounts form a
tree under an implicit `root`; users are leaves under one account and may appear under
several accounts (one association each). Shares are relative among siblings, which are
the accounts and users directly under the same parent.

Nothing here does I/O; the service loads the tree from the database and passes it in.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from typing import Annotated, NamedTuple

import msgspec

ROOT = "root"

Shares = Annotated[int, msgspec.Meta(ge=0)]


class Assoc(NamedTuple):
    """An association key: `(account, "")` for an account, `(account, user)` for a user."""

    account: str
    user: str = ""

    @property
    def is_user(self) -> bool:
        return self.user != ""


class Account(msgspec.Struct, frozen=True, kw_only=True):
    """An account; `parent=None` (or `"root"`) puts it directly under the root."""

    name: str
    parent: str | None = None
    shares: Shares = 1


class UserAssoc(msgspec.Struct, frozen=True, kw_only=True):
    """A user's membership of one account, with shares among that account's children."""

    user: str
    account: str
    shares: Shares = 1


class AccountTree(msgspec.Struct, frozen=True, kw_only=True):
    """The whole association tree, as the service loads it (order is kept for display)."""

    accounts: tuple[Account, ...] = ()
    users: tuple[UserAssoc, ...] = ()


class TreeProblem(StrEnum):
    DUPLICATE_ACCOUNT = "duplicate_account"
    DUPLICATE_USER = "duplicate_user"
    UNKNOWN_PARENT = "unknown_parent"
    UNKNOWN_ACCOUNT = "unknown_account"
    CYCLE = "cycle"
    ROOT_IS_RESERVED = "root_is_reserved"


class TreeIssue(msgspec.Struct, frozen=True, kw_only=True):
    problem: TreeProblem
    name: str
    detail: str = ""


class Node(msgspec.Struct, frozen=True, kw_only=True):
    """One association placed in the tree, with its children in configuration order."""

    assoc: Assoc
    shares: int
    depth: int  # root's children are depth 1
    children: tuple[Node, ...] = ()

    @property
    def is_user(self) -> bool:
        return self.assoc.is_user


def parent_of(account: Account) -> str:
    return account.parent or ROOT


def check_tree(tree: AccountTree) -> tuple[TreeIssue, ...]:
    """Problems that make a tree unusable, as data; an empty tuple means it is sound."""
    issues: list[TreeIssue] = []
    names: set[str] = set()
    for acct in tree.accounts:
        if acct.name == ROOT:
            issues.append(TreeIssue(problem=TreeProblem.ROOT_IS_RESERVED, name=acct.name))
        elif acct.name in names:
            issues.append(TreeIssue(problem=TreeProblem.DUPLICATE_ACCOUNT, name=acct.name))
        names.add(acct.name)
    for acct in tree.accounts:
        parent = parent_of(acct)
        if parent != ROOT and parent not in names:
            issues.append(
                TreeIssue(problem=TreeProblem.UNKNOWN_PARENT, name=acct.name, detail=parent)
            )
    parents = {a.name: parent_of(a) for a in tree.accounts if a.name != ROOT}
    for name in parents:
        seen = {name}
        cur = parents[name]
        while cur in parents:
            if cur in seen:
                issues.append(TreeIssue(problem=TreeProblem.CYCLE, name=name))
                break
            seen.add(cur)
            cur = parents[cur]
    members: set[tuple[str, str]] = set()
    for ua in tree.users:
        key = (ua.account, ua.user)
        if ua.account not in names and ua.account != ROOT:
            issues.append(
                TreeIssue(problem=TreeProblem.UNKNOWN_ACCOUNT, name=ua.user, detail=ua.account)
            )
        if key in members:
            issues.append(
                TreeIssue(problem=TreeProblem.DUPLICATE_USER, name=ua.user, detail=ua.account)
            )
        members.add(key)
    return tuple(issues)


def build(tree: AccountTree) -> Node:
    """The tree as nested nodes under root; accounts before users among siblings.

    Assumes `check_tree(tree)` is empty; associations under unknown parents are dropped.
    """
    kids: dict[str, list[Account]] = {}
    for acct in tree.accounts:
        kids.setdefault(parent_of(acct), []).append(acct)
    users: dict[str, list[UserAssoc]] = {}
    for ua in tree.users:
        users.setdefault(ua.account, []).append(ua)

    def place(name: str, shares: int, depth: int, path: frozenset[str]) -> Node:
        children = [
            place(a.name, a.shares, depth + 1, path | {a.name})
            for a in kids.get(name, ())
            if a.name not in path
        ]
        children += [
            Node(assoc=Assoc(name, u.user), shares=u.shares, depth=depth + 1)
            for u in users.get(name, ())
        ]
        return Node(assoc=Assoc(name), shares=shares, depth=depth, children=tuple(children))

    return place(ROOT, 1, 0, frozenset({ROOT}))


def walk(node: Node) -> Iterator[Node]:
    """Pre-order, configuration order; root included."""
    yield node
    for child in node.children:
        yield from walk(child)


def user_count(node: Node) -> int:
    return sum(1 for n in walk(node) if n.is_user)


def roll_up(root: Node, usage: Mapping[Assoc, float]) -> dict[Assoc, float]:
    """Raw usage of every association: its own charged usage plus its descendants'.

    `usage` holds what was charged directly to each association: normally user
    associations; usage keyed by an account is charged to that account itself.
    Usage for associations not in the tree is ignored.
    """
    out: dict[Assoc, float] = {}

    def total(node: Node) -> float:
        value = float(usage.get(node.assoc, 0.0)) + sum(total(c) for c in node.children)
        out[node.assoc] = value
        return value

    total(root)
    return out
