"""The account tree: validation as data, shape, and usage rolled up to every ancestor."""

from __future__ import annotations

import pytest

from services.fairshare.tree import (
    AccountTree,
    Assoc,
    TreeIssue,
    TreeProblem,
    build,
    check_tree,
    roll_up,
    walk,
)
from tests.unit.fairshare.builders import SLURM_CLASSIC_TREE, acct, tree, used, user

CHECK_CASES: dict[str, tuple[AccountTree, tuple[TreeIssue, ...]]] = {
    "slurm's example tree is sound": (SLURM_CLASSIC_TREE, ()),
    "users may sit directly under root": (tree(user("admin", "root")), ()),
    "an account defined twice": (
        tree(acct("A"), acct("A")),
        (TreeIssue(problem=TreeProblem.DUPLICATE_ACCOUNT, name="A"),),
    ),
    "root is not an account one can define": (
        tree(acct("root")),
        (TreeIssue(problem=TreeProblem.ROOT_IS_RESERVED, name="root"),),
    ),
    "a parent nobody defined": (
        tree(acct("B", parent="A")),
        (TreeIssue(problem=TreeProblem.UNKNOWN_PARENT, name="B", detail="A"),),
    ),
    "accounts that are each other's parent": (
        tree(acct("A", parent="B"), acct("B", parent="A")),
        (
            TreeIssue(problem=TreeProblem.CYCLE, name="A"),
            TreeIssue(problem=TreeProblem.CYCLE, name="B"),
        ),
    ),
    "a user in an account nobody defined, twice": (
        tree(user("ada", "X"), user("ada", "X")),
        (
            TreeIssue(problem=TreeProblem.UNKNOWN_ACCOUNT, name="ada", detail="X"),
            TreeIssue(problem=TreeProblem.UNKNOWN_ACCOUNT, name="ada", detail="X"),
            TreeIssue(problem=TreeProblem.DUPLICATE_USER, name="ada", detail="X"),
        ),
    ),
}


@pytest.mark.parametrize(("t", "want"), CHECK_CASES.values(), ids=CHECK_CASES.keys())
def test_check_tree(t: AccountTree, want: tuple[TreeIssue, ...]) -> None:
    assert check_tree(t) == want


def test_build_places_accounts_before_users_in_configuration_order() -> None:
    t = tree(acct("A"), user("a1", "A"), acct("A2", parent="A"), user("boss", "root"))
    assert [(n.assoc, n.depth, n.shares) for n in walk(build(t))] == [
        (Assoc("root"), 0, 1),
        (Assoc("A"), 1, 1),
        (Assoc("A2"), 2, 1),
        (Assoc("A", "a1"), 2, 1),
        (Assoc("root", "boss"), 1, 1),
    ]


def test_usage_rolls_up_to_every_ancestor_and_unknown_usage_is_ignored() -> None:
    usage = used(u1__B=2.0, u2__C=3.0, C=1.0, u4__E=5.0, ghost__Z=100.0)
    assert roll_up(build(SLURM_CLASSIC_TREE), usage) == {
        Assoc("root"): 11.0,
        Assoc("A"): 6.0,
        Assoc("B"): 2.0,
        Assoc("B", "u1"): 2.0,
        Assoc("C"): 4.0,
        Assoc("C", "u2"): 3.0,
        Assoc("C", "u3"): 0.0,
        Assoc("D"): 5.0,
        Assoc("E"): 5.0,
        Assoc("E", "u4"): 5.0,
        Assoc("F"): 0.0,
        Assoc("F", "u5"): 0.0,
    }
