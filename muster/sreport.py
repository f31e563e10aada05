"""Pure core of the `sreport` shim (muster/shims.py): Slurm's chargeback report,
`sreport cluster AccountUtilizationByUser`, from `muster.api.report`
(services/fairshare/report.py), as scripts parse it.

    sreport [-t hours|minutes|seconds] [-T gres/gpu] [-P|-p] [-n]
            cluster AccountUtilizationByUser [start=2027-01-01] [end=2027-02-01]
            [accounts=a,b] [users=u,v]

Words and options as Slurm's (report names in any case); GPU time, not CPU time, is
what a row's `Used` counts, and the title says so. Rows: `root` (the whole window),
then each account, each followed by its users and its sub-accounts (whose usage its
own row counts), as Slurm's tree. Anything else is
refused with what to write instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0}
REPORT = ("cluster", "accountutilizationbyuser")
COLUMNS = (("Cluster", 9), ("Account", 15), ("Login", 9), ("Proper Name", 15), ("Used", 8),
           ("Energy", 8))  # fmt: skip
RULE = "-" * 80


class SreportError(ValueError):
    """A command line the shim cannot answer; the message says what to write."""


class SreportArgs(msgspec.Struct, frozen=True, kw_only=True):
    unit: str = "minutes"  # Slurm's default
    delimiter: str | None = None  # -P / -p: "|"
    trailing: bool = False  # -p: a delimiter after the last field too
    header: bool = True  # -n: neither the title nor the column names
    since: float | None = None
    until: float | None = None
    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()


def parse(argv: Sequence[str], when: Callable[[str], float]) -> SreportArgs:
    """The options and the report's words; `when` reads a time (start=, end=)."""
    opts: dict[str, Any] = {}
    words: list[str] = []
    rest = list(argv)
    while rest:
        word = rest.pop(0)
        if word in ("-P", "--parsable2"):
            opts["delimiter"] = "|"
        elif word in ("-p", "--parsable"):
            opts |= {"delimiter": "|", "trailing": True}
        elif word in ("-n", "--noheader"):
            opts["header"] = False
        elif word in ("-t", "--time-format") or word.startswith(("-t", "--time-format=")):
            unit = rest.pop(0) if word in ("-t", "--time-format") and rest else word
            unit = unit.removeprefix("--time-format=").removeprefix("-t").lower()
            if unit not in UNITS:
                raise SreportError(f"-t {unit}: one of {', '.join(UNITS)} (percent is not kept)")
            opts["unit"] = unit
        elif word in ("-T", "--tres") or word.startswith("--tres="):
            tres = rest.pop(0) if word in ("-T", "--tres") and rest else word
            if tres.removeprefix("--tres=").lower() not in ("gres/gpu", "gpu"):
                raise SreportError(f"-T {tres}: GPU time is what is kept; give -T gres/gpu")
        elif word.startswith("-"):
            raise SreportError(f"unknown option {word}: -t, -T, -P, -p and -n are understood")
        else:
            words.append(word)
    report = tuple(w.lower() for w in words[:2])
    if report != REPORT:
        raise SreportError(
            f"report {' '.join(words[:2]) or '(none)'} is not kept: the one report is"
            " 'cluster AccountUtilizationByUser' (muster report gives the same)"
        )
    for word in words[2:]:
        key, _, value = word.partition("=")
        key = key.lower()
        if key in ("start", "end"):
            try:
                opts["since" if key == "start" else "until"] = when(value)
            except (ValueError, TypeError) as err:
                raise SreportError(f"{word}: {err}") from err
        elif key in ("accounts", "account"):
            opts["accounts"] = tuple(v for v in value.split(",") if v)
        elif key in ("users", "user"):
            opts["users"] = tuple(v for v in value.split(",") if v)
        elif key != "tree":  # Slurm's tree display: the rows are in tree order already
            raise SreportError(f"{word}: start=, end=, accounts= and users= are understood")
    return SreportArgs(**opts)


def lines(
    args: SreportArgs, cluster: str, since: float, until: float, rows: Sequence[Any]
) -> list[str]:
    """The report's lines: the title, the column names, root, then the rows (`ReportRow`:
    an account's has user None)."""
    per = UNITS[args.unit]
    table = [
        (
            cluster,
            "root",
            "",
            "",
            sum(r.gpu_seconds for r in rows if r.user is None and r.depth == 1),
        )
    ]
    table += [(cluster, r.account, r.user or "", "", r.gpu_seconds) for r in rows]
    cells = [[*row[:4], str(round(row[4] / per)), "0"] for row in table]
    out: list[str] = []
    if args.header:
        out += [
            RULE,
            f"Cluster/Account/User Utilization {_time(since)} - {_time(until - 1)}"
            f" ({round(until - since)} secs)",
            f"Usage reported in GPU {args.unit.capitalize()}",
            RULE,
        ]
    names = [name for name, _ in COLUMNS]
    if args.delimiter is not None:
        end = args.delimiter if args.trailing else ""
        body = [names] if args.header else []
        return out + [args.delimiter.join(r) + end for r in [*body, *cells]]
    if args.header:
        out.append(" ".join(_fit(n, w) for n, w in COLUMNS))
        out.append(" ".join("-" * w for _, w in COLUMNS))
    return out + [" ".join(_fit(c, w) for c, (_, w) in zip(r, COLUMNS, strict=True)) for r in cells]


def _fit(text: str, width: int) -> str:
    """Right-aligned in `width`; longer is cut with a `+`, as Slurm's columns are."""
    return text.rjust(width) if len(text) <= width else text[: width - 1] + "+"


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
