"""What a signal that stops nothing reaches (Slurm's `scancel -s`, `-b`, `-f`)."""

from __future__ import annotations

from enum import StrEnum


class SignalScope(StrEnum):
    """On a node: the job's worker (its process group; `B:` its script alone), the tasks
    of the job's srun steps, or both. An sbatch job's script runs on its first node and
    its work in steps: Slurm's `scancel -s SIG` signals the steps, `-b` the script, `-f`
    both. A job whose worker is its work (`muster submit`, torchrun) has one scope."""

    WORKER = "worker"
    STEPS = "steps"
    FULL = "full"
