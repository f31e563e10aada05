"""The cached calculator and the simulator's `priority_fn(job, now, usage_by_account)`."""

from __future__ import annotations

import msgspec

from services.fairshare.calculator import (
    FairShareCalculator,
    job_factors_input,
    make_priority_fn,
)
from services.fairshare.core import FairShareAlgorithm, ShareOptions
from services.fairshare.priority import JobFactorsInput, PriorityWeights
from services.fairshare.tree import Assoc
from shared.jobspec import JobSpec
from tests.unit.fairshare.builders import SLURM_CLASSIC_TREE, SLURM_CLASSIC_USAGE, acct, tree, user


class SimJob(msgspec.Struct, frozen=True, kw_only=True):
    """The shape a trace simulator's job might have."""

    user: str
    account: str
    submit_time: float
    gpus: int


def test_factors_follow_the_last_update() -> None:
    calc = FairShareCalculator(SLURM_CLASSIC_TREE, auto_add=False)
    assert calc.factor("C", "u2") == 1.0  # nobody has used anything yet
    calc.update(by_assoc=SLURM_CLASSIC_USAGE)
    got = {u: calc.factor(a, u) for a, u in [("F", "u5"), ("E", "u4"), ("B", "u1"), ("C", "u2")]}
    assert got == {"u5": 1.0, "u4": 0.8, "u1": 0.6, "u2": 0.2}


def test_a_newcomer_gets_what_a_user_without_usage_would_get_in_that_account() -> None:
    calc = FairShareCalculator(SLURM_CLASSIC_TREE, auto_add=False)
    calc.update(by_assoc=SLURM_CLASSIC_USAGE)
    # C is entered at rank 2 of 5; D at rank 5; an unknown account is a newcomer at the top
    assert (calc.factor("C", "new"), calc.factor("D", "new"), calc.factor("zzz", "new")) == (
        0.4,
        1.0,
        1.0,
    )


def test_classic_newcomers_get_their_account_factor() -> None:
    calc = FairShareCalculator(
        SLURM_CLASSIC_TREE, ShareOptions(algorithm=FairShareAlgorithm.CLASSIC, usage_total=1.0)
    )
    calc.update(by_assoc=SLURM_CLASSIC_USAGE)
    assert round(calc.factor("B", "u1"), 6) == 0.408479
    assert calc.factor("C", "new") == calc.factor("C", "u3")


def test_usage_by_account_adds_unknown_accounts_under_root() -> None:
    calc = FairShareCalculator(tree(acct("a"), user("ann", "a")))
    calc.update({"a": 30.0, "b": 10.0})
    assert [(r.account, r.user, r.raw_usage) for r in calc.rows] == [
        ("root", None, 40.0),
        ("a", None, 30.0),
        ("a", "ann", 0.0),
        ("b", None, 10.0),
    ]


def test_priority_fn_ranks_the_account_that_used_less_first() -> None:
    calc = FairShareCalculator()
    fn = make_priority_fn(calc, PriorityWeights(fairshare=1000, age=100), cluster_gpus=64)
    usage = {"heavy": 900.0, "light": 100.0}
    jobs = [
        SimJob(user="h", account="heavy", submit_time=0.0, gpus=8),
        SimJob(user="l", account="light", submit_time=0.0, gpus=8),
    ]
    for j in jobs:
        calc.ensure(j.account, j.user)
    got = [fn(j, 7 * 86400.0, usage) for j in jobs]
    assert got == [100.0 + 500.0, 100.0 + 1000.0]
    assert calc.factor("heavy", "h") == 0.5


def test_priority_fn_recomputes_only_when_usage_changes() -> None:
    calc = FairShareCalculator()
    fn = make_priority_fn(calc, PriorityWeights(fairshare=1000))
    j = SimJob(user="u", account="a", submit_time=0.0, gpus=1)
    fn(j, 0.0, {"a": 1.0})
    table = calc.table
    fn(j, 1.0, {"a": 1.0})
    assert calc.table is table
    fn(j, 2.0, {"a": 2.0})
    assert calc.table is not table


def test_job_specs_and_simulator_jobs_read_into_factor_inputs() -> None:
    spec = JobSpec(
        user="ada", account="physics", script="train.py", gpus_per_node=8, nodes_max=2, nice=5
    )
    sim = SimJob(user="ada", account="physics", submit_time=42.0, gpus=4)
    assert [job_factors_input(j, 0.5, cluster_gpus=64, now=99.0) for j in (spec, sim)] == [
        JobFactorsInput(
            eligible_at=99.0, fairshare=0.5, gpus=16, cluster_gpus=64, nice=5, partition="normal"
        ),
        JobFactorsInput(eligible_at=42.0, fairshare=0.5, gpus=4, cluster_gpus=64),
    ]


def test_ensure_adds_a_user_once() -> None:
    calc = FairShareCalculator()
    assert (calc.ensure("a", "u"), calc.ensure("a", "u")) == (True, False)
    assert calc.factor("a", "u") == 1.0
    assert Assoc("a", "u") in {Assoc(r.account, r.user or "") for r in calc.rows}
