"""`-I[N]` / `--immediate[=N]`: salloc (and srun outside a job) gives its request up
when the allocation is not granted within N seconds; srun inside a job stops waiting
for GPUs the job's running steps hold after N seconds. The words are taken as Slurm's
are: attached or `=` values only (the next word is the command), a bare `-I` is 1 s."""

from __future__ import annotations

import pytest

from muster.salloc import SallocError, submit_request
from muster.srun_alloc import split
from muster.srun_error import SrunError
from muster.steps import immediate, parse

SALLOC = {
    "none": (["-N1", "bash"], None, ["bash"]),
    "bare -I: at once": (["-I", "-N1", "bash"], 1.0, ["bash"]),
    "-I5": (["-N1", "-I5", "bash"], 5.0, ["bash"]),
    "--immediate=30": (["--immediate=30", "bash", "-I"], 30.0, ["bash", "-I"]),
    "--immediate, no command": (["-t", "5", "--immediate"], 1.0, []),
    "the last one wins": (["-I9", "--immediate=4", "bash"], 4.0, ["bash"]),
}


@pytest.mark.parametrize(("argv", "within", "command"), SALLOC.values(), ids=SALLOC.keys())
def test_salloc_immediate(argv: list[str], within: float | None, command: list[str]) -> None:
    req, got_command, got_within = submit_request(argv, "/w", {})
    assert (got_within, got_command) == (within, command)
    assert not any(w.startswith(("-I", "--immediate")) for w in req.argv)  # not sbatch's


def test_salloc_immediate_takes_seconds() -> None:
    with pytest.raises(SallocError, match="invalid --immediate value 'soon'"):
        submit_request(["--immediate=soon", "bash"], "/w", {})


def test_srun_outside_a_job_gives_immediate_to_the_allocation() -> None:
    assert split(["-N2", "-I10", "-l", "hostname"]) == (
        ["-N2", "-I10"],
        ["-N2", "-l"],
        ["hostname"],
    )


@pytest.mark.parametrize(
    ("argv", "patience"),
    [
        (["true"], None),
        (["-I", "true"], 1.0),
        (["-I0", "true"], 1.0),
        (["-I7", "-n1", "true"], 7.0),
        (["--immediate=2", "true"], 2.0),
        (["--immediate", "true"], 1.0),
    ],
)
def test_srun_immediate_inside_a_job(argv: list[str], patience: float | None) -> None:
    assert immediate(parse(argv)[0]) == patience
    assert parse(argv)[1] == ["true"]


def test_srun_immediate_takes_seconds() -> None:
    with pytest.raises(SrunError, match="invalid --immediate value 'x'"):
        parse(["--immediate=x", "true"])
