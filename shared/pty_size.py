"""Pure: a terminal's window size as `srun --pty` sends it to the node's relay.

srun sends its terminal's size on the step's `<subject>.in`, the subject its keys go
on (the only one its user may publish to there, shared/bus_auth.py), as a message with
no body and this header: `rows cols`. The relay sets it on the task's pty, so the task
gets SIGWINCH and reads the new size, as on a local terminal. A header that is not two
whole numbers in 1..65535 is ignored. Import-free, for the CLI's lean path.
"""

from __future__ import annotations

WINDOW_HEADER = "Muster-Window"
_MAX = 65535  # the kernel's struct winsize holds unsigned shorts


def encode(rows: int, cols: int) -> str:
    return f"{rows} {cols}"


def decode(text: str) -> tuple[int, int] | None:
    """(rows, cols), or None for anything else."""
    parts = text.split()
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    rows, cols = int(parts[0]), int(parts[1])
    if not (1 <= rows <= _MAX and 1 <= cols <= _MAX):
        return None
    return rows, cols
