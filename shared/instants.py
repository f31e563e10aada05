"""Pure: Slurm's instants, `now+1hour`, `2026-12-08T10:00`, `12/08`, `16:00`, `teatime`.

One grammar, as Slurm's commands share one: sbatch's `--begin` (admission, `timefmt`)
reads a clock time or a date without a year as the next one to come; sacct's `-S` / `-E`
(the shim) as the last one past, and takes `now-N` back. The current time is passed in;
nothing here reads a clock. A date is in the time zone passed (Slurm's: local time).
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, tzinfo

INSTANT_FORMS = (
    "now[{+|-}N[seconds|minutes|hours|days|weeks]], YYYY-MM-DD[THH:MM[:SS]], "
    "MM/DD[/YY], MMDD[YY], HH:MM[:SS], today, tomorrow, midnight, noon, fika or teatime"
)
UNIT_SECONDS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 604800),
}
_RELATIVE = re.compile(r"now(?:([+-])(\d{1,9})([a-z]*))?")
_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?")
_US_DATE = re.compile(r"(\d{1,2})[/.](\d{1,2})(?:[/.](\d{2}))?")
_PACKED_DATE = re.compile(r"(\d{2})(\d{2})(\d{2})?")  # MMDD[YY]
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2}))?")
_NAMED_CLOCK = {"midnight": time(0), "noon": time(12), "fika": time(15), "teatime": time(16)}


def instant(text: str, *, now: float, tz: tzinfo, ahead: bool) -> float | None:
    """Epoch seconds for `text` (any case), None when it is none of `INSTANT_FORMS`.
    `ahead`: a clock time or a date without a year is the next to come (`--begin`),
    else the last past (`sacct -S`). Raises ValueError for a form with a bad value
    (month 13, an unknown unit)."""
    raw = text.strip().lower()
    current = datetime.fromtimestamp(now, tz)
    if m := _RELATIVE.fullmatch(raw):
        sign, count, unit = m.groups()
        if count is None:
            return now
        if unit not in UNIT_SECONDS:
            raise ValueError(f"unknown unit {unit!r}")
        return now + (1 if sign == "+" else -1) * int(count) * UNIT_SECONDS[unit]
    if raw in ("today", "tomorrow"):
        day = current.date() + timedelta(days=1 if raw == "tomorrow" else 0)
        return datetime.combine(day, time(0), tz).timestamp()
    if raw in _NAMED_CLOCK:
        return _clock(current, _NAMED_CLOCK[raw], tz, ahead)
    if m := _ISO.fullmatch(raw):
        y, mo, d, hh, mm, ss = (int(g) if g else 0 for g in m.groups())
        return datetime(y, mo, d, hh, mm, ss, tzinfo=tz).timestamp()
    if m := _US_DATE.fullmatch(raw) or _PACKED_DATE.fullmatch(raw):
        return _day(current, int(m.group(1)), int(m.group(2)), m.group(3), tz, ahead)
    if m := _CLOCK.fullmatch(raw):
        hh, mm, ss = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
        return _clock(current, time(hh, mm, ss), tz, ahead)
    return None


def _day(current: datetime, month: int, day: int, yy: str | None, tz: tzinfo, ahead: bool) -> float:
    """A date's midnight; without a year the next (`ahead`) or the last such date."""
    year = 2000 + int(yy) if yy else current.year
    when = date(year, month, day)
    if yy is None and ahead and when < current.date():
        when = date(year + 1, month, day)
    elif yy is None and not ahead and when > current.date():
        when = date(year - 1, month, day)
    return datetime.combine(when, time(0), tz).timestamp()


def _clock(current: datetime, at: time, tz: tzinfo, ahead: bool) -> float:
    """Today at `at`; tomorrow if that has passed and `ahead`, yesterday if it has not
    come and not `ahead`."""
    when = datetime.combine(current.date(), at, tz)
    if ahead and when < current:
        when += timedelta(days=1)
    elif not ahead and when > current:
        when -= timedelta(days=1)
    return when.timestamp()
