"""What a signal that stops nothing reaches (Slurm's `scancel -s`, `-b`, `-f`), and the
names a signal is given by."""

from __future__ import annotations

import signal as _signal
from enum import StrEnum


def signal_name(text: str) -> str:
    """`USR1`, `SIGUSR1`, `10` -> `SIGUSR1`; ValueError naming the accepted forms."""
    raw = text.strip().upper()
    try:
        if raw.isdigit():
            return _signal.Signals(int(raw)).name
        name = raw if raw.startswith("SIG") else f"SIG{raw}"
        return _signal.Signals[name].name
    except (KeyError, ValueError):
        raise ValueError(
            f"unknown signal {text!r}; use a name such as USR1, TERM, INT or a number"
        ) from None


class SignalScope(StrEnum):
    """On a node: the job's worker (its process group; `B:` its script alone), the tasks
    of the job's srun steps, or both. An sbatch job's script runs on its first node and
    its work in steps: Slurm's `scancel -s SIG` signals the steps, `-b` the script, `-f`
    both. A job whose worker is its work (`muster submit`, torchrun) has one scope."""

    WORKER = "worker"
    STEPS = "steps"
    FULL = "full"
