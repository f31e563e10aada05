"""Pure: Slurm time formats, durations for `--time` and instants for `--begin`.

Durations accept every form sbatch documents: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`,
`D-H:M:S`, plus `UNLIMITED` / `INFINITE` (returned as None: "the partition's maximum").
`--begin` needs the current time passed in; nothing here reads a clock.
Parsers raise `ValueError` with a message meant for the submitter; callers turn it into
a `SubmitError`.
"""

from __future__ import annotations

import re
from datetime import UTC, tzinfo

from shared.instants import INSTANT_FORMS, instant

DURATION_FORMS = "M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED"
BEGIN_FORMS = INSTANT_FORMS

_INT = re.compile(r"\d{1,9}")
_UNLIMITED = frozenset({"unlimited", "infinite"})


def _num(part: str, text: str) -> int:
    if not _INT.fullmatch(part):
        raise ValueError(f"invalid time {text!r}: expected {DURATION_FORMS}")
    return int(part)


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration; None for UNLIMITED/INFINITE."""
    text = text.strip()
    if text.lower() in _UNLIMITED:
        return None
    days = 0
    rest = text
    if "-" in text:
        day_part, rest = text.split("-", 1)
        days = _num(day_part, text)
        fields = [_num(p, text) for p in rest.split(":")]
        if len(fields) > 3:
            raise ValueError(f"invalid time {text!r}: expected {DURATION_FORMS}")
        hours, minutes, seconds = [*fields, 0, 0][:3]
    else:
        fields = [_num(p, text) for p in rest.split(":")]
        if len(fields) == 1:
            hours, minutes, seconds = 0, fields[0], 0
        elif len(fields) == 2:
            hours, minutes, seconds = 0, fields[0], fields[1]
        elif len(fields) == 3:
            hours, minutes, seconds = fields
        else:
            raise ValueError(f"invalid time {text!r}: expected {DURATION_FORMS}")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_duration(seconds: int | None) -> str:
    """Canonical Slurm form: `HH:MM:SS`, or `D-HH:MM:SS` from a day up."""
    if seconds is None:
        return "UNLIMITED"
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_begin(text: str, *, now: float, tz: tzinfo = UTC) -> float:
    """Epoch seconds for a `--begin` value; `now` is epoch seconds, dates are in `tz`
    (shared/instants.py: a clock time or a date without a year is the next to come)."""
    try:
        found = instant(text, now=now, tz=tz, ahead=True)
    except ValueError as err:  # e.g. month 13: say which forms work
        raise ValueError(f"invalid --begin {text!r}: {err}; expected {BEGIN_FORMS}") from err
    if found is None:
        raise ValueError(f"invalid --begin {text!r}: expected {BEGIN_FORMS}")
    return found
