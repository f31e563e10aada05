"""Fair Tree: level fair share, depth-first ranking and Slurm's tie rules."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.fairshare.core import ShareTable, compute_shares, user_factors
from services.fairshare.fairtree import level_fair_share
from services.fairshare.tree import AccountTree, Assoc
from tests.unit.fairshare.builders import (
    SLURM_CLASSIC_TREE,
    SLURM_CLASSIC_USAGE,
    acct,
    tree,
    used,
    user,
)


def factors(table: ShareTable) -> dict[str, float]:
    return {f"{a.user}@{a.account}": f for a, f in user_factors(table).items()}


def level_fs(table: ShareTable) -> dict[str, float | None]:
    return {(r.user or r.account): r.level_fs for r in table.rows if r.depth > 0}


# name -> (tree, usage, want factor per user@account)
RANK_CASES: dict[str, tuple[AccountTree, dict[Assoc, float], dict[str, float]]] = {
    # The fair_tree page's own example: Acct1 is the first common ancestor of UserA and
    # UserB, so their order is that of Acct12 and Acct16, whose Level FS decide.
    "the user under the sibling account with the higher level fs ranks higher": (
        tree(
            acct("Acct1"),
            acct("Acct12", parent="Acct1"),
            acct("Acct16", parent="Acct1"),
            user("UserA", "Acct12"),
            user("UserB", "Acct16"),
        ),
        used(UserA__Acct12=30, UserB__Acct16=10),
        {"UserA@Acct12": 0.5, "UserB@Acct16": 1.0},
    ),
    # The classic page's tree under Fair Tree: D (LF 1.68) before A (0.62); under D,
    # F (no usage, LF inf) before E; under A, B (1.69) before C (0.45); in C, u3
    # (no usage) before u2. Ranks 5..1 over 5 users.
    "slurm's example tree is ranked depth first by level fair share": (
        SLURM_CLASSIC_TREE,
        SLURM_CLASSIC_USAGE,
        {"u5@F": 1.0, "u4@E": 0.8, "u1@B": 0.6, "u3@C": 0.4, "u2@C": 0.2},
    ),
    "sibling users with the same level fair share share a rank": (
        tree(acct("A"), user("a1", "A"), user("a2", "A"), user("a3", "A")),
        used(a1__A=10, a2__A=10),
        {"a3@A": 1.0, "a1@A": 2 / 3, "a2@A": 2 / 3},
    ),
    "a user tied with a sibling account takes the rank of its best user": (
        tree(acct("P"), user("p1", "P"), user("q", "root"), user("r", "root")),
        used(p1__P=10, q__root=10, r__root=30),
        {"p1@P": 1.0, "q@root": 1.0, "r@root": 1 / 3},
    ),
    "tied sibling accounts have their children merged before descending": (
        tree(
            acct("A"),
            acct("B"),
            user("a1", "A"),
            user("a2", "A"),
            user("b1", "B"),
            user("b2", "B"),
        ),
        used(a1__A=10, b1__B=5, b2__B=5),
        # merged: a2 (inf), b1 and b2 (1.0), a1 (0.5); unmerged a1 would beat b1, b2
        {"a2@A": 1.0, "b1@B": 0.75, "b2@B": 0.75, "a1@A": 0.25},
    ),
    "nobody has used anything: everybody ties at the top": (
        tree(acct("A", 3), acct("B"), user("a", "A"), user("b", "B")),
        {},
        {"a@A": 1.0, "b@B": 1.0},
    ),
    "an account with zero shares ranks below one that used its share": (
        tree(acct("A", 0), acct("B"), user("a", "A"), user("b", "B")),
        used(b__B=100),
        {"b@B": 1.0, "a@A": 0.5},
    ),
}


@pytest.mark.parametrize(("accounts", "usage", "want"), RANK_CASES.values(), ids=RANK_CASES.keys())
def test_fair_tree_ranks(
    accounts: AccountTree, usage: dict[Assoc, float], want: dict[str, float]
) -> None:
    assert factors(compute_shares(accounts, usage)) == want


def test_level_fair_share_of_slurm_example_tree() -> None:
    got = level_fs(compute_shares(SLURM_CLASSIC_TREE, SLURM_CLASSIC_USAGE))
    rounded = {k: (v if v is None or math.isinf(v) else round(v, 4)) for k, v in got.items()}
    assert rounded == {
        "A": round(0.4 / (0.45 / 0.7), 4),
        "B": round(0.75 / (0.2 / 0.45), 4),
        "u1": 1.0,
        "C": round(0.25 / (0.25 / 0.45), 4),
        "u2": 0.5,
        "u3": math.inf,
        "D": round(0.6 / (0.25 / 0.7), 4),
        "E": round((25 / 60) / 1.0, 4),
        "u4": 1.0,
        "F": math.inf,
        "u5": math.inf,
    }


LF_CASES = {
    "under-served is above one": (0.5, 0.25, 2.0),
    "over-served is below one": (0.25, 0.5, 0.5),
    "no usage is infinite": (0.5, 0.0, math.inf),
    "no shares is zero even without usage": (0.0, 0.0, 0.0),
}


@pytest.mark.parametrize(("shares", "usage", "want"), LF_CASES.values(), ids=LF_CASES.keys())
def test_level_fair_share(shares: float, usage: float, want: float) -> None:
    assert level_fair_share(shares, usage) == want


usages = st.dictionaries(
    st.sampled_from(["x1", "x2", "y1", "y2", "z1"]),
    st.integers(min_value=0, max_value=1000),
)
shares = st.integers(min_value=1, max_value=10)


def two_account_tree(sx: int, sy: int) -> AccountTree:
    return tree(
        acct("X", sx),
        acct("Y", sy),
        user("x1", "X"),
        user("x2", "X"),
        user("y1", "Y"),
        user("y2", "Y"),
        user("z1", "Y"),
    )


def usage_of(raw: dict[str, int]) -> dict[Assoc, float]:
    return {Assoc("X" if k.startswith("x") else "Y", k): float(v) for k, v in raw.items()}


@given(sx=shares, sy=shares, raw=usages)
def test_every_user_of_a_higher_level_fs_account_outranks_every_user_of_its_sibling(
    sx: int, sy: int, raw: dict[str, int]
) -> None:
    table = compute_shares(two_account_tree(sx, sy), usage_of(raw))
    lf = {r.account: r.level_fs for r in table.rows if r.depth == 1 and r.user is None}
    f = user_factors(table)
    xs = [v for a, v in f.items() if a.account == "X"]
    ys = [v for a, v in f.items() if a.account == "Y"]
    assert lf["X"] is not None and lf["Y"] is not None
    if lf["X"] > lf["Y"]:
        assert min(xs) > max(ys)
    elif lf["Y"] > lf["X"]:
        assert min(ys) > max(xs)


@given(sx=shares, sy=shares, raw=usages, used_y=st.integers(min_value=1, max_value=1000))
def test_an_account_with_no_usage_ranks_above_a_sibling_with_usage(
    sx: int, sy: int, raw: dict[str, int], used_y: int
) -> None:
    only_y = {k: v for k, v in raw.items() if not k.startswith("x")} | {"y1": used_y}
    f = user_factors(compute_shares(two_account_tree(sx, sy), usage_of(only_y)))
    assert min(v for a, v in f.items() if a.account == "X") == 1.0
    assert max(v for a, v in f.items() if a.account == "Y") < 1.0


@given(sx=shares, sy=shares, raw=usages)
def test_factors_are_ranks_over_users_the_best_is_one_and_equal_usage_ties(
    sx: int, sy: int, raw: dict[str, int]
) -> None:
    table = compute_shares(two_account_tree(sx, sy), usage_of(raw))
    ranks = {Assoc(r.account, r.user): r.rank or 0 for r in table.rows if r.user}
    f = user_factors(table)
    assert max(f.values()) == 1.0
    assert all(f[a] == ranks[a] / 5 for a in f)
    y1, y2 = f[Assoc("Y", "y1")], f[Assoc("Y", "y2")]
    if raw.get("y1", 0) == raw.get("y2", 0):
        assert y1 == y2
