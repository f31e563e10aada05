"""Clients told to end: SIGTERM and SIGHUP to `srun` and `salloc` (docs/steps.md).

Python's default for both is to die where the process stands, so an srun killed by a
closed terminal (SIGHUP) or by `kill` (SIGTERM) left its step's tasks running until
the job ended, and a salloc left its allocation held to its time limit. Each client
installs a handler instead (`handled`), as Slurm's do: srun ends its step, salloc
lets its allocation go (or, once its command runs, passes SIGTERM on to it). A signal
the process inherited as ignored (`nohup`, `trap '' HUP`) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# srun --pty's loop hears Ctrl-C as a signal too: its terminal is not raw while the step
# waits for GPUs, and a piped stdin never makes it raw
TOLD = (signal.SIGINT, *SIGNALS)


class Ended(BaseException):
    """Raised by a handler where the signal arrives, as Ctrl-C raises KeyboardInterrupt
    (a BaseException too: an `except Exception` on the way does not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def status(self) -> int:
        """The exit status a shell reports for a command this signal ended."""
        return 128 + self.signum


def end(signum: int) -> None:
    raise Ended(signum)


def heard(signals: tuple[signal.Signals, ...] = SIGNALS) -> list[signal.Signals]:
    """SIGTERM and SIGHUP (or `signals`), but for one the process inherited as ignored
    (`nohup`; a shell script's `cmd &` for SIGINT)."""
    return [s for s in signals if signal.getsignal(s) is not signal.SIG_IGN]


@contextmanager
def handled(handler: Callable[[int], None] = end) -> Iterator[None]:
    """`handler(signum)` for SIGTERM and SIGHUP while inside; the earlier handlers after.
    Outside the main thread (no handler can be set there) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on(signum: int, _frame: FrameType | None) -> None:
        handler(signum)

    earlier = {s: signal.getsignal(s) for s in heard()}
    for s in earlier:
        signal.signal(s, on)
    try:
        yield
    finally:
        for s, was in earlier.items():
            if was is not None:  # None: a handler not set from Python, left as it is
                signal.signal(s, was)
