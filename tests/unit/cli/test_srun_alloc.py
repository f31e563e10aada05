"""`srun` outside an allocation (muster/srun_alloc.py): how its words split into the
allocation's options (sbatch's), the step's (the shaping ones and srun's own flags) and
the command, as a table; and when srun is inside a job at all."""

from __future__ import annotations

import pytest

from muster.srun_alloc import named, split
from muster.srun_error import SrunError
from muster.steps import in_job

CASES = [
    (
        ["-N2", "--gpus-per-node=1", "-t", "5", "-l", "bash", "-c", "x"],
        (["-N2", "--gpus-per-node=1", "-t", "5"], ["-N2", "-l"], ["bash", "-c", "x"]),
    ),
    (  # a value given as the next word; `--` ends the options; the command's own -N
        ["-N", "2", "-n4", "--pty", "--exclusive", "-J", "x", "--", "python", "-N"],
        (
            ["-N", "2", "-n4", "--exclusive", "-J", "x"],
            ["-N", "2", "-n4", "--pty"],
            ["python", "-N"],
        ),
    ),
    (  # srun's --mpi is accepted and ignored, as inside a job
        ["--mpi", "pmix", "-p", "gpu", "--mpi=none", "hostname"],
        (["-p", "gpu"], [], ["hostname"]),
    ),
    (
        ["-w", "node01", "--gpus-per-task", "1", "-u", "a", "-l"],
        (  # -w names the allocation's node and the step's
            ["-w", "node01", "--gpus-per-task", "1"],
            ["-w", "node01", "--gpus-per-task", "1", "-u"],
            ["a", "-l"],
        ),
    ),
    (["--exclusive"], (["--exclusive"], [], [])),
    (  # the tasks' output files are the step's alone
        ["-N2", "-o", "out-%t", "--error=e-%N", "--open-mode=append", "a"],
        (["-N2"], ["-N2", "-o", "out-%t", "--error=e-%N", "--open-mode=append"], ["a"]),
    ),
]


@pytest.mark.parametrize(("argv", "want"), CASES)
def test_the_words_split_into_allocation_step_and_command(
    argv: list[str], want: tuple[list[str], list[str], list[str]]
) -> None:
    assert split(argv) == want


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-thing", "a"], "unrecognized option '--no-such-thing'"),
        (["-t"], "option requires an argument -- 't'"),
    ],
)
def test_a_bad_option_is_named(argv: list[str], message: str) -> None:
    with pytest.raises(SrunError, match=message):
        split(argv)


def test_a_job_name_is_the_users_when_given() -> None:
    assert named(["-J", "x"]) and named(["--job-name=y"]) and not named(["-N", "2"])


@pytest.mark.parametrize(
    ("argv", "env", "inside"),
    [
        (["hostname"], {"SLURM_JOB_ID": "7"}, True),
        (["hostname"], {"MUSTER_JOB_ID": "7"}, True),
        (["--jobid=7", "hostname"], {}, True),
        (["hostname"], {}, False),
        (["--gpus-per-node=1", "hostname"], {}, False),
    ],
)
def test_srun_is_inside_a_job_when_its_environment_or_jobid_names_one(
    argv: list[str], env: dict[str, str], inside: bool
) -> None:
    assert in_job(argv, env) is inside
