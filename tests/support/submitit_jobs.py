"""Functions the submitit tests run on a Muster cluster: importable by the job's
interpreter, so submitit pickles them by reference."""

from __future__ import annotations

import os
import time
from pathlib import Path

import submitit


def add(a: int, b: int) -> int:
    return a + b


def square(x: int) -> tuple[int, str]:
    return x * x, os.environ.get("SLURM_ARRAY_TASK_ID", "")


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


class Counter(submitit.helpers.Checkpointable):
    """Counts to `steps`, one step per `pause_s`, logging `attempt step` lines to
    `log`. Preempted, submitit pickles this object (with `done`) through `checkpoint`,
    and the requeued attempt carries on from there."""

    def __init__(self) -> None:
        self.done = 0

    def __call__(self, steps: int, pause_s: float, log: str) -> tuple[int, list[str]]:
        attempt = os.environ.get("SLURM_RESTART_COUNT", "?")
        with Path(log).open("a") as out:
            while self.done < steps:
                time.sleep(pause_s)
                self.done += 1
                out.write(f"{attempt} {self.done}\n")
                out.flush()
        return self.done, Path(log).read_text().split("\n")
