"""Client: `srun` outside an allocation — Slurm's srun then makes one (docs/steps.md).

`srun [options] CMD` with no job in its environment (no SLURM_JOB_ID, MUSTER_JOB_ID or
`--jobid`) is `salloc [options] srun [step options] CMD`: the options are sbatch's (the
allocation: `-N`, `--gpus-per-node`, `-t`, `-p`, `--exclusive`, ...), those that shape a
step (`-N`, `-n`, `--ntasks-per-node`, `--gpus-per-task`, `-w`) are the step's too, and
srun's own flags (`-l`, `-u`, `--pty`, `--overlap`) and its output files (`-o`, `-e`,
`--open-mode`: the step's tasks', as Slurm's srun writes them) only the step's; `-I[N]`
(`--immediate`) only the allocation's, which is then given up after N seconds. The job
is named after the command unless `-J` names it. srun waits for the allocation, runs
the step on it, and releases it when the step ends: the job ends as the step did
(COMPLETED, or FAILED with its status), and srun exits with the step's status.
"""

from __future__ import annotations

import os
import sys

from muster import salloc
from muster.client import ApiRefused
from muster.srun_error import SrunError
from shared.sbatch_options import tokenize

STEP_FLAGS = frozenset(
    {"-l", "--label", "-u", "--unbuffered", "--pty", "--overlap", "-K", "--kill-on-bad-exit"}
)  # srun's own: the step's only
STEP_SHAPE = frozenset({"nodes", "ntasks", "ntasks-per-node", "gpus-per-task", "nodelist"})
STEP_ONLY = frozenset({"output", "error", "open-mode"})  # valued, the step's files alone
IGNORED = ("--mpi",)  # srun's own, valued: accepted and ignored, as inside a job


def split(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The allocation's options, the step's options, and the command."""
    alloc: list[str] = []
    step: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return alloc, step, argv[i + 1 :]
        if not word.startswith("-") or word == "-":
            return alloc, step, argv[i:]
        if word in STEP_FLAGS or word.startswith(("-K", "--kill-on-bad-exit=")):
            step.append(word)
            i += 1
            continue
        if word in ("-I", "--immediate") or word.startswith(("-I", "--immediate=")):
            alloc.append(word)  # salloc's: how long to wait for the allocation
            i += 1
            continue
        if word.partition("=")[0] in IGNORED:
            i += 1 if "=" in word else 2
            continue
        taken = argv[i : i + 1]
        tokens = tokenize(taken)
        if tokens.problems and tokens.problems[0].kind == "missing" and i + 1 < len(argv):
            taken = argv[i : i + 2]  # the option's value is the next word
            tokens = tokenize(taken)
        if tokens.problems:
            raise SrunError(tokens.problems[0].message)
        if any(g.name in STEP_ONLY for g in tokens.given):
            step += taken
            i += len(taken)
            continue
        alloc += taken
        if any(g.name in STEP_SHAPE for g in tokens.given):
            step += taken
        i += len(taken)
    return alloc, step, []


def named(alloc: list[str]) -> bool:
    return any(g.name == "job-name" for g in tokenize(alloc).given)


def run(argv: list[str]) -> int:
    alloc, step, command = split(argv)
    if not command:
        raise SrunError("no command to run: srun [options] CMD [ARGS]")
    if not named(alloc):
        alloc.append(f"--job-name={os.path.basename(command[0])}")
    inner = [sys.executable, "-m", "muster.cli", "srun", *step, "--", *command]
    try:
        return salloc.run([*alloc, *inner], voice=salloc.SRUN)
    except (salloc.SallocError, ApiRefused) as err:
        raise SrunError(str(err)) from None
