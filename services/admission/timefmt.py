"""Pure: Slurm time formats, durations for `--time` and instants for `--begin`.

Durations accept every form sbatch documents: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`,
`D-H:M:S`, plus `UNLIMITED` / `INFINITE` (returned as None: "the partition's maximum").
`--begin` needs the current time passed in; nothing here reads a clock.
Parsers raise `ValueError` with a message meant for the submitter; callers turn it into
a `SubmitError`.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, time, timedelta, tzinfo

DURATION_FORMS = "M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED"
BEGIN_FORMS = (
    "now[+N[seconds|minutes|hours|days|weeks]], YYYY-MM-DD[THH:MM[:SS]], "
    "MM/DD[/YY], HH:MM[:SS], today, tomorrow, midnight, noon, fika or teatime"
)

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


_UNIT_SECONDS = {
    "": 1,
    "s": 1,
    "sec": 1,
    "secs": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "mins": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "d": 86400,
    "day": 86400,
    "days": 86400,
    "w": 604800,
    "week": 604800,
    "weeks": 604800,
}
_RELATIVE = re.compile(r"now(?:\+(\d{1,9})([a-z]*))?")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?")
_US_DATE = re.compile(r"(\d{1,2})/(\d{1,2})(?:/(\d{2}))?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_NAMED_CLOCK = {"midnight": time(0), "noon": time(12), "fika": time(15), "teatime": time(16)}


def parse_begin(text: str, *, now: float, tz: tzinfo = UTC) -> float:
    """Epoch seconds for a `--begin` value; `now` is epoch seconds, dates are in `tz`."""
    raw = text.strip().lower()  # so 2026-12-01T08:30 matches with a lower-case t
    current = datetime.fromtimestamp(now, tz)
    try:
        found = _begin(raw, current, tz)
    except ValueError as err:  # e.g. month 13: say which forms work
        raise ValueError(f"invalid --begin {text!r}: {err}; expected {BEGIN_FORMS}") from err
    if found is None:
        raise ValueError(f"invalid --begin {text!r}: expected {BEGIN_FORMS}")
    return found


def _begin(raw: str, current: datetime, tz: tzinfo) -> float | None:
    if m := _RELATIVE.fullmatch(raw):
        count, unit = m.group(1), m.group(2)
        if count is None:
            return current.timestamp()
        if unit not in _UNIT_SECONDS:
            raise ValueError(f"unknown unit {unit!r}")
        return current.timestamp() + int(count) * _UNIT_SECONDS[unit]
    if raw in ("today", "tomorrow"):
        day = current.date() + timedelta(days=1 if raw == "tomorrow" else 0)
        return datetime.combine(day, time(0), tz).timestamp()
    if raw in _NAMED_CLOCK:
        return _next_clock(current, _NAMED_CLOCK[raw], tz)
    if m := _ISO.fullmatch(raw):
        y, mo, d, hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        return datetime(y, mo, d, hh, mm, ss, tzinfo=tz).timestamp()
    if m := _US_DATE.fullmatch(raw):
        mo, d = int(m.group(1)), int(m.group(2))
        year = 2000 + int(m.group(3)) if m.group(3) else current.year
        when = date(year, mo, d)
        if m.group(3) is None and when < current.date():
            when = date(year + 1, mo, d)  # a date already past this year means next year
        return datetime.combine(when, time(0), tz).timestamp()
    if m := _CLOCK.fullmatch(raw):
        hh, mm, ss = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        return _next_clock(current, time(hh, mm, ss), tz)
    return None


def _next_clock(current: datetime, at: time, tz: tzinfo) -> float:
    """Today at `at`, or tomorrow if that moment has passed (as sbatch does)."""
    when = datetime.combine(current.date(), at, tz)
    if when < current:
        when += timedelta(days=1)
    return when.timestamp()
