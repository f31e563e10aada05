"""Plumbing: how a command ends in ordinary shell use — a closed pipe (`muster queue |
head`), Ctrl-C, an unreachable cluster — with one line or nothing, never a traceback."""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal.py builds enums of every signal
import os
import sys

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Callable

INTERRUPTED: int = 128 + _signal.SIGINT  # what a shell reports for a command Ctrl-C stopped
BROKEN_PIPE: int = 128 + _signal.SIGPIPE  # what `head` leaves a C program that kept writing


def quietly(run: Callable[[], int]) -> int:
    """`run()`'s exit status; a reader gone away ends it silently (as SIGPIPE would end
    a C program), Ctrl-C with nothing but the shell's usual status."""
    try:
        try:
            return run()
        finally:  # a closed pipe shows here, not at exit as "Exception ignored"
            sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return BROKEN_PIPE
    except KeyboardInterrupt:
        print(file=sys.stderr)  # the shell's prompt starts on a line of its own
        return INTERRUPTED


def _stdout_to_devnull() -> None:
    """Python flushes stdout again at exit; pointed at /dev/null that flush is silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
