"""Table tests: `srun -w` (steps_core.layout's `nodelist`, muster/steps.py's parse): a
step on exactly the nodes it names, in the allocation's rank order; a name outside the
allocation, or a -N that disagrees, refused with what to change."""

from __future__ import annotations

import pytest

from muster.srun_error import SrunError
from muster.steps import step_request
from services.launcher.steps_core import Layout, Refusal, StepShape, layout

NODES = ("n1", "n2", "n3")
GPUS = {"n1": [0, 1], "n2": [2, 3], "n3": [4, 5]}
ENV = {"SLURM_JOB_ID": "7", "MUSTER_USER": "alice"}


@pytest.mark.parametrize(
    ("shape", "where"),
    [
        (StepShape(nodelist=("n2",)), [("n2", 0)]),
        (StepShape(nodelist=("n3", "n1")), [("n1", 0), ("n3", 1)]),  # rank order
        (StepShape(nodelist=("n3",), ntasks=2), [("n3", 0), ("n3", 0)]),
        (StepShape(nodelist=("n1", "n3"), nodes=2, ntasks=3), [("n1", 0), ("n1", 0), ("n3", 1)]),
        # -w wins over placing a GPU step where GPUs are free: the user named the node
        (StepShape(nodelist=("n1",), gpus_per_task=1), [("n1", 0)]),
    ],
)
def test_a_step_runs_on_the_nodes_it_names(shape: StepShape, where: list[tuple[str, int]]) -> None:
    lay = layout(shape, NODES, GPUS)
    assert isinstance(lay, Layout), lay
    assert [(t.node, t.nodeid) for t in lay.tasks] == where


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (
            StepShape(nodelist=("n2", "n9", "gpu1")),
            "-w n9,gpu1: not in the job's allocation (n[1-3])",
        ),
        (
            StepShape(nodelist=("n1", "n2"), nodes=1),
            "-N 1 with -w naming 2 node(s): give one or the other, "
            "or as many nodes in -w as -N says",
        ),
    ],
)
def test_a_nodelist_the_allocation_cannot_give_is_refused(shape: StepShape, message: str) -> None:
    assert layout(shape, NODES, GPUS) == Refusal(message=message)


def test_a_held_node_named_by_w_is_busy_not_moved() -> None:
    lay = layout(StepShape(nodelist=("n1",), gpus_per_task=1), NODES, GPUS, {"n1": {0, 1}})
    assert not isinstance(lay, Layout), lay


@pytest.mark.parametrize(
    ("argv", "nodelist"),
    [
        (["-w", "n[1-2]", "hostname"], ("n1", "n2")),
        (["--nodelist=n3,n1", "hostname"], ("n3", "n1")),
        (["-wn2", "hostname"], ("n2",)),
        (["hostname"], ()),
    ],
)
def test_srun_expands_its_nodelist(argv: list[str], nodelist: tuple[str, ...]) -> None:
    assert step_request(argv, ENV, "/w").nodelist == nodelist


@pytest.mark.parametrize("value", ["n[1-", "n[3-1]"])
def test_a_malformed_nodelist_is_refused_by_srun(value: str) -> None:
    with pytest.raises(SrunError, match=r"^-w: "):
        step_request(["-w", value, "hostname"], ENV, "/w")
