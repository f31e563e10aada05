"""srun's --output / --error inside a job (muster/step_output.py): Slurm's step
patterns, each task's node from the launcher's answer, and the files the follower
writes (shared by the tasks whose paths match; a file that cannot be opened leaves its
output on srun's own stream)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from muster.step_output import JobNames, Routes, paths, task_nodes
from shared.api import StepReply
from shared.outputs import expand_step_pattern

JOB = JobNames(job_id=12, name="train", user="alice")
REPLY = StepReply(step_id=3, state="RUNNING", nodes=("n1", "n2"), ntasks=3, tasks_per_node=(2, 1))


@pytest.mark.parametrize(
    ("pattern", "path"),
    [
        ("out-%j.%s-%t.txt", "out-12.3-4.txt"),
        ("%J/%N-%n", "12.3/n2-1"),
        ("%x_%u_%3t_%%", "train_alice_004_%"),
        ("%A_%a", "12_4294967294"),  # outside an array: the job id and NO_VAL
        ("%q%t", "%q4"),  # an unknown escape stays
    ],
)
def test_step_patterns(pattern: str, path: str) -> None:
    got = expand_step_pattern(
        pattern, job_id=12, step_id=3, procid=4, node="n2", nodeid=1, name="train", user="alice"
    )
    assert got == path


@pytest.mark.parametrize(
    ("reply", "nodes"),
    [
        (REPLY, [("n1", 0), ("n1", 0), ("n2", 1)]),
        # an older launcher says no counts: even blocks, the first nodes one more
        (
            StepReply(step_id=0, state="RUNNING", nodes=("a", "b"), ntasks=3),
            [("a", 0)] * 2 + [("b", 1)],
        ),
        (
            StepReply(step_id=0, state="RUNNING", nodes=("a", "b", "c"), ntasks=3),
            [("a", 0), ("b", 1), ("c", 2)],
        ),
    ],
)
def test_each_tasks_node(reply: StepReply, nodes: list[tuple[str, int]]) -> None:
    assert task_nodes(reply) == nodes


def test_paths_per_task_per_node_and_shared() -> None:
    assert paths("o-%t", "", REPLY, JOB, "/w") == {
        "0.out": "/w/o-0",
        "0.err": "/w/o-0",  # no --error: stderr with stdout
        "1.out": "/w/o-1",
        "1.err": "/w/o-1",
        "2.out": "/w/o-2",
        "2.err": "/w/o-2",
    }
    assert paths("", "/logs/e-%N", REPLY, JOB, "/w") == {  # stdout stays srun's
        "0.err": "/logs/e-n1",
        "1.err": "/logs/e-n1",
        "2.err": "/logs/e-n2",
    }


def test_routes_write_files_shared_by_matching_paths(tmp_path: Path) -> None:
    (tmp_path / "old-n1").write_bytes(b"kept\n")
    routes = Routes(output="out-%N", error="err-%t", append=False)
    assert not routes.ready  # nowhere to write before the step is made
    routes.open(REPLY, JOB, str(tmp_path))
    assert routes.ready
    assert routes.stream("0.out") is routes.stream("1.out")  # both on n1: one file
    assert routes.stream("0.err") is not routes.stream("1.err")
    routes.stream("0.out").write(b"a\n")
    routes.stream("1.out").write(b"b\n")
    routes.stream("1.err").write(b"oops\n")
    routes.close()
    assert (tmp_path / "out-n1").read_bytes() == b"a\nb\n"
    assert (tmp_path / "out-n2").read_bytes() == b""  # made, though task 2 printed nothing
    assert (tmp_path / "err-1").read_bytes() == b"oops\n"
    appending = Routes(output="old-%N", append=True)
    appending.open(REPLY, JOB, str(tmp_path))
    appending.stream("0.out").write(b"more\n")
    appending.close()
    assert (tmp_path / "old-n1").read_bytes() == b"kept\nmore\n"


def test_a_file_that_cannot_be_opened_is_said_once_and_srun_keeps_its_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routes = Routes(output="missing/out-%N")
    routes.open(REPLY, JOB, str(tmp_path))
    said = capsys.readouterr().err
    assert said.count(f"cannot open {tmp_path}/missing/out-n1") == 1
    assert "No such file or directory" in said
    assert routes.stream("0.out") is sys.stdout.buffer
    assert routes.stream("0.err") is sys.stderr.buffer
    routes.close()


def test_without_patterns_everything_is_srun_own() -> None:
    routes = Routes()
    assert routes.ready
    assert routes.stream("4.out") is sys.stdout.buffer
    assert routes.stream("4.err") is sys.stderr.buffer
