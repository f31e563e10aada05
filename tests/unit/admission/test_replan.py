"""Pure: a pending job's placement fields changed in place (services/admission/
replan.py), checked as a submission is, against the shipped configuration and its four
nodes of four GPUs (node04 also the debug partition's)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.admission.cluster_shape import NodeShape, shape
from services.admission.config import load_config
from services.admission.replan import PlacementChange, replanned
from services.admission.validate import SubmitCounts
from shared.jobspec import Dependency, JobSpec

CONFIG = load_config(
    (Path(__file__).resolve().parents[3] / "deploy" / "local" / "cluster.toml").read_text()
)
CLUSTER = shape(
    CONFIG,
    [
        NodeShape(name=f"node0{i}", gpus=4, features=("a100",) if i > 2 else ())
        for i in (1, 2, 3, 4)
    ],
)
SPEC = JobSpec(
    user="alice", account="research", partition="normal", qos="normal", script="true",
    nodes_min=1, nodes_max=1, gpus_per_node=1, time_limit_s=3600, partitions=("normal", "debug"),
)  # fmt: skip

CHANGED = {
    "to another partition: the list asked at submission goes": (
        PlacementChange(partition="large"),
        {"partition": "large", "partitions": ()},
    ),
    "more nodes, elastic": (
        PlacementChange(nodes=(2, 4)),
        {"nodes_min": 2, "nodes_max": 4, "elastic": True},
    ),
    "fixed nodes, more GPUs each": (
        PlacementChange(nodes=(2, 2), gpus_per_node=4),
        {"nodes_min": 2, "nodes_max": 2, "elastic": False, "gpus_per_node": 4},
    ),
    "nodes excluded, and features asked": (
        PlacementChange(exclude="node[01-02]", constraint="a100"),
        {"excluded_nodes": ("node01", "node02"), "constraint": "a100"},
    ),
    "a QOS": (PlacementChange(qos="low"), {"qos": "low"}),
    "nodes required": (
        PlacementChange(nodelist="node[02-03]", nodes=(2, 2)),
        {"required_nodes": ("node02", "node03"), "nodes_min": 2, "nodes_max": 2,
         "elastic": False},
    ),
    "a later start": (PlacementChange(begin_at=2e9), {"begin_at": 2e9}),
    "a dependency": (
        PlacementChange(dependency="afterok:3?afterany:4"),
        {"dependencies": (Dependency(kind="afterok", job_ids=(3,)),
                          Dependency(kind="afterany", job_ids=(4,))), "dependency_any": True},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("change", "fields"), CHANGED.values(), ids=CHANGED.keys())
def test_a_change_that_fits_gives_the_spec_with_it(
    change: PlacementChange, fields: dict[str, object]
) -> None:
    assert replanned(SPEC, change, CONFIG, CLUSTER) == msgspec.structs.replace(SPEC, **fields)


def test_an_empty_value_clears_the_exclusions_features_and_dependency() -> None:
    asked = msgspec.structs.replace(
        SPEC, excluded_nodes=("node01",), constraint="a100",
        dependencies=(Dependency(kind="afterok", job_ids=(3,)),),
    )  # fmt: skip
    cleared = PlacementChange(exclude="", constraint="", dependency="")
    assert replanned(asked, cleared, CONFIG, CLUSTER) == (
        msgspec.structs.replace(asked, excluded_nodes=(), constraint=None, dependencies=())
    )


REFUSED = {
    "no such partition": (SPEC, PlacementChange(partition="huge"), "no partition 'huge'"),
    "a partition the account may not use": (
        SPEC, PlacementChange(partition="inference"), "account 'research' may not",
    ),
    "a limit over the new partition's maximum": (
        SPEC, PlacementChange(partition="debug"), "time limit",
    ),
    "more nodes than the partition has": (SPEC, PlacementChange(nodes=(5, 5)), "5"),
    "more GPUs per node than any node has": (SPEC, PlacementChange(gpus_per_node=8), "8"),
    "GPUs asked per task": (
        msgspec.structs.replace(SPEC, gpus_per_task=1), PlacementChange(gpus_per_node=2),
        "its GPUs were asked as --gpus-per-task",
    ),
    "features no node has": (SPEC, PlacementChange(constraint="h100"), "h100"),
    "fewer than no GPUs": (SPEC, PlacementChange(gpus_per_node=-1), "0 or more"),
    "a bad hostlist": (SPEC, PlacementChange(exclude="node[01"), "--exclude: invalid hostlist"),
    "a node not in the cluster required": (
        SPEC, PlacementChange(nodelist="node09"), "node09",
    ),
    "more nodes required than the job asks": (
        SPEC, PlacementChange(nodelist="node[01-02]"), "--nodelist names 2 nodes",
    ),
    "a node both required and excluded": (
        SPEC, PlacementChange(nodelist="node01", exclude="node01"), "both required",
    ),
    "an account the owner is not in": (
        SPEC, PlacementChange(account="prod"), "user 'alice' is not in account 'prod'",
    ),
    "an account no partition of it allows": (
        msgspec.structs.replace(SPEC, user="bob", partition="large"),
        PlacementChange(account="prod"), "account 'prod' may not use partition 'large'",
    ),
    "a dependency of no kind Slurm has": (
        SPEC, PlacementChange(dependency="before:3"), "invalid --dependency 'before:3'",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("spec", "change", "said"), REFUSED.values(), ids=REFUSED.keys())
def test_a_change_that_does_not_fit_says_why(
    spec: JobSpec, change: PlacementChange, said: str
) -> None:
    out = replanned(spec, change, CONFIG, CLUSTER)
    assert isinstance(out, tuple) and any(said in why for why in out), out


def test_without_partitions_a_job_is_checked_against_the_registered_nodes_alone() -> None:
    wider = replanned(SPEC, PlacementChange(nodes=(2, 2), gpus_per_node=4), None, CLUSTER)
    assert isinstance(wider, JobSpec) and (wider.nodes_max, wider.gpus_per_node) == (2, 4)
    assert replanned(SPEC, PlacementChange(gpus_per_node=8), None, CLUSTER) == (
        "8 GPUs per node requested, but the largest node has 4 GPUs; ask for"
        " --gpus-per-node=4 or fewer and more nodes",
    )
    moved = replanned(SPEC, PlacementChange(partition="large"), None, CLUSTER)
    assert isinstance(moved, tuple) and "configures no partitions" in moved[0]


def test_a_move_into_a_qos_counts_the_job_once_even_as_an_array_task() -> None:
    """`low` caps a user at 1000 unfinished jobs: the job moving there adds one, though
    it is a task of an array larger than the room left."""
    task = msgspec.structs.replace(SPEC, array_spec="0-99", array_task_id=7, array_job_id=1)
    to_low = PlacementChange(qos="low")
    room = SubmitCounts(user_jobs=999)
    assert replanned(task, to_low, CONFIG, CLUSTER, room) == msgspec.structs.replace(
        task, qos="low"
    )
    full = replanned(task, to_low, CONFIG, CLUSTER, SubmitCounts(user_jobs=1000))
    assert isinstance(full, tuple) and "adding 1 would pass its limit of 1000" in full[0], full


def test_an_owner_in_two_accounts_moves_a_job_between_them() -> None:
    bobs = msgspec.structs.replace(SPEC, user="bob")
    moved = replanned(bobs, PlacementChange(account="prod"), CONFIG, CLUSTER)
    assert isinstance(moved, JobSpec) and moved.account == "prod", moved
    nowhere = replanned(bobs, PlacementChange(account="prod"), None, CLUSTER)
    assert nowhere == ("this cluster keeps no accounts to move a job to (accounting is off)",)
