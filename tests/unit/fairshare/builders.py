"""Builders for fair-share tests: trees written as nested calls, usage as keyword maps."""

from __future__ import annotations

from services.fairshare.tree import Account, AccountTree, Assoc, UserAssoc


def acct(name: str, shares: int = 1, parent: str | None = None) -> Account:
    return Account(name=name, parent=parent, shares=shares)


def user(name: str, account: str, shares: int = 1) -> UserAssoc:
    return UserAssoc(user=name, account=account, shares=shares)


def tree(*items: Account | UserAssoc) -> AccountTree:
    return AccountTree(
        accounts=tuple(i for i in items if isinstance(i, Account)),
        users=tuple(i for i in items if isinstance(i, UserAssoc)),
    )


def used(**by_user_at_account: float) -> dict[Assoc, float]:
    """`used(u1__B=0.2)` charges 0.2 to user u1 in account B; `used(B=1)` to account B."""
    out: dict[Assoc, float] = {}
    for key, value in by_user_at_account.items():
        name, _, account = key.partition("__")
        out[Assoc(account, name) if account else Assoc(name)] = value
    return out


# The tree of Slurm's classic fair-share documentation (Figure 3): A 40 and D 60 under
# root; B 30 and C 10 under A; E 25 and F 35 under D; user 1 in B, users 2 and 3 in C,
# user 4 in E, user 5 in F, one share each.
SLURM_CLASSIC_TREE = tree(
    acct("A", 40),
    acct("D", 60),
    acct("B", 30, parent="A"),
    acct("C", 10, parent="A"),
    acct("E", 25, parent="D"),
    acct("F", 35, parent="D"),
    user("u1", "B"),
    user("u2", "C"),
    user("u3", "C"),
    user("u4", "E"),
    user("u5", "F"),
)
# Users 1, 2 and 4 used 0.2, 0.25 and 0.25 of the machine.
SLURM_CLASSIC_USAGE = used(u1__B=0.2, u2__C=0.25, u4__E=0.25)
