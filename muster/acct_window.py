"""Pure: the time window of `sacct -S START -E END` (muster/shims.py).

Slurm's forms (shared/instants.py), in local time, read as the past: `-S 08:00` is this
morning, `-S 12/01` the last 1 December, `-S now-2days` two days ago. Without `-S`, as
Slurm's sacct: jobs since midnight today, unless jobs are named with `-j` (then any
time). Muster's sacct also takes epoch seconds.
"""

from __future__ import annotations

from datetime import datetime, time, tzinfo

from shared.instants import INSTANT_FORMS, instant


class WindowError(ValueError):
    """A start or end sacct cannot read; the message names the forms it takes."""


def acct_window(
    start: str | None, end: str | None, *, by_job: bool, now: float, tz: tzinfo
) -> tuple[float | None, float | None]:
    """(since, until) in epoch seconds for the accounting request; None: no bound."""
    since = _when("-S", start, now, tz) if start is not None else None
    if start is None and not by_job:
        since = datetime.combine(datetime.fromtimestamp(now, tz).date(), time(0), tz).timestamp()
    until = _when("-E", end, now, tz) if end is not None else None
    if since is not None and until is not None and until < since:
        raise WindowError(f"-E {end} is before -S {start}: the window would hold no job")
    return since, until


def _when(option: str, text: str, now: float, tz: tzinfo) -> float:
    """Slurm's form first (`1201` is MMDD), then epoch seconds."""
    try:
        found = instant(text, now=now, tz=tz, ahead=False)
    except ValueError as err:
        raise WindowError(f"invalid {option} {text!r}: {err}; expected {INSTANT_FORMS}") from err
    if found is not None:
        return found
    try:
        return float(text)
    except ValueError:
        raise WindowError(
            f"invalid {option} {text!r}: expected {INSTANT_FORMS} or epoch seconds"
        ) from None
