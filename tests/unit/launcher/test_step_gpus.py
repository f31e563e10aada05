"""Table tests: the GPUs a step holds alone while it runs (steps_core.layout's `busy`),
as Slurm's steps are exclusive: side-by-side steps get different GPUs, a step whose
GPUs are held waits (Busy) unless another node of the job has them free, --overlap and
a step asking no GPUs hold none. `--gpus-per-node` (`--gres=gpu:N`) gives each node's
tasks the same GPUs, and `--gpus` splits the step's total evenly over its nodes."""

from __future__ import annotations

import pytest

from services.launcher.steps_core import Busy, Layout, Refusal, StepShape, layout

NODES = ("n1", "n2")
GPUS = {"n1": [0, 1, 2, 3], "n2": [4, 5, 6, 7]}


def one(gpus: int = 1, *, overlap: bool = False) -> StepShape:
    return StepShape(nodes=1, ntasks=1, gpus_per_task=gpus, overlap=overlap)


@pytest.mark.parametrize(
    ("shape", "busy", "bound", "held"),
    [
        # a sweep's steps, one after another: each gets the next free GPU
        (one(), {}, [(0,)], {"n1": [0]}),
        (one(), {"n1": {0}}, [(1,)], {"n1": [1]}),
        (one(), {"n1": {0, 2}}, [(1,)], {"n1": [1]}),
        (one(2), {"n1": {1}}, [(0, 2)], {"n1": [0, 2]}),
        # two tasks a node on both nodes, some GPUs held on each
        (
            StepShape(nodes=2, ntasks_per_node=2, gpus_per_task=1),
            {"n1": {0}, "n2": {7}},
            [(1,), (2,), (4,), (5,)],
            {"n1": [1, 2], "n2": [4, 5]},
        ),
        # --overlap: binds from every GPU the job holds there, held or not; holds none
        (one(overlap=True), {"n1": {0, 1, 2, 3}}, [(0,)], {}),
        # no --gpus-per-task: sees the node's whole share, holds none
        (StepShape(nodes=1), {"n1": {0, 1, 2, 3}}, [(0, 1, 2, 3)], {}),
        # busy GPUs on another node do not matter
        (one(4), {"n2": {4, 5, 6, 7}}, [(0, 1, 2, 3)], {"n1": [0, 1, 2, 3]}),
        # a step on fewer nodes than the job has goes where its GPUs are free, as
        # Slurm places it: the sweep's ninth step on the second node
        (one(), {"n1": {0, 1, 2, 3}}, [(4,)], {"n2": [4]}),
        (one(2), {"n1": {0, 2, 3}, "n2": {4}}, [(5, 6)], {"n2": [5, 6]}),
        # --gpus-per-node (--gres=gpu:2): the node's tasks share its two free GPUs
        (
            StepShape(nodes=1, ntasks=2, gpus_per_node=2),
            {"n1": {0}},
            [(1, 2), (1, 2)],
            {"n1": [1, 2]},
        ),
        (
            StepShape(gpus_per_node=1),
            {"n2": {4}},
            [(0,), (5,)],
            {"n1": [0], "n2": [5]},
        ),
        # a one-node step goes where a node has them free
        (StepShape(nodes=1, gpus_per_node=4), {"n1": {3}}, [(4, 5, 6, 7)], {"n2": [4, 5, 6, 7]}),
        # --gpus: the step's total, split evenly over its nodes
        (StepShape(gpus=4), {}, [(0, 1), (4, 5)], {"n1": [0, 1], "n2": [4, 5]}),
        (StepShape(nodes=1, ntasks=3, gpus=2), {"n1": {0}}, [(1, 2)] * 3, {"n1": [1, 2]}),
        # --overlap: the first of the node's share, held or not; holds none
        (
            StepShape(nodes=1, gpus_per_node=2, overlap=True),
            {"n1": {0, 1, 2, 3}},
            [(0, 1)],
            {},
        ),
    ],
)
def test_a_step_gets_gpus_no_running_step_holds(
    shape: StepShape, busy: dict[str, set[int]], bound: list[tuple[int, ...]], held: object
) -> None:
    lay = layout(shape, NODES, GPUS, busy)
    assert isinstance(lay, Layout), lay
    assert [t.gpus for t in lay.tasks] == bound
    assert lay.held() == held


@pytest.mark.parametrize(
    ("shape", "busy", "message"),
    [
        (  # every node full: the first says why
            one(),
            {"n1": {0, 1, 2, 3}, "n2": {4, 5, 6, 7}},
            "--gpus-per-task=1 x 1 task(s) needs 1 GPUs on n1; "
            "the job's running steps hold 4 of its 4 there",
        ),
        (
            one(2),
            {"n1": {0, 3, 2}, "n2": {4, 5, 7}},
            "--gpus-per-task=2 x 1 task(s) needs 2 GPUs on n1; "
            "the job's running steps hold 3 of its 4 there",
        ),
        (
            StepShape(nodes=2, gpus_per_task=4),
            {"n2": {6}},
            "--gpus-per-task=4 x 1 task(s) needs 4 GPUs on n2; "
            "the job's running steps hold 1 of its 4 there",
        ),
    ],
)
def test_a_step_whose_gpus_are_held_is_busy(
    shape: StepShape, busy: dict[str, set[int]], message: str
) -> None:
    assert layout(shape, NODES, GPUS, busy) == Busy(message=message)


def test_more_gpus_than_the_job_holds_is_refused_not_busy() -> None:
    """Waiting would never help: a refusal, whatever the steps hold."""
    lay = layout(one(5), NODES, GPUS, {"n1": {0}})
    assert isinstance(lay, Refusal)
    assert lay.message == "--gpus-per-task=5 x 1 task(s) needs 5 GPUs on n1; the job holds 4 there"


@pytest.mark.parametrize(
    ("shape", "busy", "message"),
    [
        (
            StepShape(gpus_per_node=2),
            {"n2": {4, 6, 7}},
            Busy(
                message="--gpus-per-node=2 needs 2 GPUs on n2; "
                "the job's running steps hold 3 of its 4 there"
            ),
        ),
        (
            StepShape(gpus=10),
            {},
            Refusal(message="--gpus=10 over 2 node(s) needs 5 GPUs on n1; the job holds 4 there"),
        ),
        (
            StepShape(gpus=3),
            {},
            Refusal(
                message="--gpus=3 does not split evenly over the step's 2 node(s): give a "
                "multiple of 2, -N to use fewer nodes, or --gpus-per-node"
            ),
        ),
        (
            StepShape(gpus=1),
            {},
            Refusal(
                message="--gpus=1 does not split evenly over the step's 2 node(s): give a "
                "multiple of 2, -N to use fewer nodes, or --gpus-per-node"
            ),
        ),
        (
            StepShape(gpus_per_task=1, gpus_per_node=1),
            {},
            Refusal(
                message="give one of --gpus-per-task, --gpus-per-node (--gres=gpu:N) and --gpus"
            ),
        ),
    ],
)
def test_per_node_and_total_gpus_busy_or_refused(
    shape: StepShape, busy: dict[str, set[int]], message: object
) -> None:
    assert layout(shape, NODES, GPUS, busy) == message
