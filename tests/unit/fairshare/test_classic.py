"""Classic fair share against the worked example of Slurm's classic_fair_share page."""

from __future__ import annotations

import pytest

from services.fairshare.classic import classic_factor
from services.fairshare.core import FairShareAlgorithm, ShareOptions, ShareTable, compute_shares
from services.fairshare.tree import Assoc
from tests.unit.fairshare.builders import SLURM_CLASSIC_TREE, SLURM_CLASSIC_USAGE, tree, used

CLASSIC_MACHINE = ShareOptions(algorithm=FairShareAlgorithm.CLASSIC, usage_total=1.0)


def summary(table: ShareTable) -> dict[Assoc, tuple[float, float, float | None]]:
    """(normalized shares, effective usage, factor) per association, as Slurm rounds."""
    return {
        Assoc(r.account, r.user or ""): (
            round(r.norm_shares, 6),
            round(r.effective_usage, 4),
            None if r.fairshare is None else round(r.fairshare, 6),
        )
        for r in table.rows
        if r.depth > 0
    }


def test_slurm_documentation_example_reproduces_every_effective_usage_and_factor() -> None:
    table = compute_shares(SLURM_CLASSIC_TREE, SLURM_CLASSIC_USAGE, CLASSIC_MACHINE)
    assert summary(table) == {
        Assoc("A"): (0.4, 0.45, 0.458502),
        Assoc("B"): (0.3, 0.3875, 0.408479),
        Assoc("B", "u1"): (0.3, 0.3875, 0.408479),
        Assoc("C"): (0.1, 0.3, 0.125),
        Assoc("C", "u2"): (0.05, 0.275, 0.022097),
        Assoc("C", "u3"): (0.05, 0.15, 0.125),
        Assoc("D"): (0.6, 0.25, 0.749154),
        Assoc("E"): (0.25, 0.25, 0.5),
        Assoc("E", "u4"): (0.25, 0.25, 0.5),
        Assoc("F"): (0.35, 0.1458, 0.749154),
        Assoc("F", "u5"): (0.35, 0.1458, 0.749154),
    }


def test_by_default_usage_is_normalised_to_everything_the_cluster_charged() -> None:
    # Same tree, but the 0.7 charged is the whole of the cluster's usage, as in Slurm.
    table = compute_shares(
        SLURM_CLASSIC_TREE, SLURM_CLASSIC_USAGE, ShareOptions(algorithm=FairShareAlgorithm.CLASSIC)
    )
    got = {(r.account, r.user): round(r.norm_usage, 6) for r in table.rows}
    assert got == {
        ("root", None): 1.0,
        ("A", None): 0.642857,
        ("B", None): 0.285714,
        ("B", "u1"): 0.285714,
        ("C", None): 0.357143,
        ("C", "u2"): 0.357143,
        ("C", "u3"): 0.0,
        ("D", None): 0.357143,
        ("E", None): 0.357143,
        ("E", "u4"): 0.357143,
        ("F", None): 0.0,
        ("F", "u5"): 0.0,
    }


FACTOR_CASES = {
    "using exactly the share gives one half": (0.25, 0.25, 1.0, 0.5),
    "no usage gives one": (0.0, 0.25, 1.0, 1.0),
    "twice the share gives one quarter": (0.5, 0.25, 1.0, 0.25),
    "dampening softens overuse": (0.5, 0.25, 2.0, 0.5),
    "no shares gives zero whatever the usage": (0.0, 0.0, 1.0, 0.0),
}


@pytest.mark.parametrize(
    ("effective", "shares", "dampening", "want"), FACTOR_CASES.values(), ids=FACTOR_CASES.keys()
)
def test_classic_factor(effective: float, shares: float, dampening: float, want: float) -> None:
    assert classic_factor(effective, shares, dampening) == want


def test_a_user_who_never_ran_pays_for_the_usage_of_their_account_mates() -> None:
    table = compute_shares(
        tree(*SLURM_CLASSIC_TREE.accounts, *SLURM_CLASSIC_TREE.users),
        used(u2__C=0.25),
        CLASSIC_MACHINE,
    )
    factors = {r.user: r.fairshare for r in table.rows if r.user}
    assert factors["u3"] is not None and factors["u3"] < 1.0
    assert factors["u5"] == 1.0
