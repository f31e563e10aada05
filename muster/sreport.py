"""Pure core of the `sreport` shim (muster/shims.py): Slurm's usage reports, from
`muster.api.report` (services/fairshare/report.py), as scripts parse them.

    sreport [-t hours|minutes|seconds] [-T gres/gpu] [-P|-p] [-n]
            cluster AccountUtilizationByUser | cluster UserUtilizationByAccount |
            user TopUsage [TopCount=10] [group] | cluster Utilization |
            job SizesByAccount [grouping=8,64,256] [printjobcount] [flatview]
            [start=2027-01-01] [end=2027-02-01] [accounts=a,b] [users=u,v]

Words and options as Slurm's (report names in any case); GPU time, not CPU time, is
what a row's `Used` counts, and the title says so. AccountUtilizationByUser: `root`
(the whole window), then each account, each followed by its users and its
sub-accounts (whose usage its own row counts), as Slurm's tree. UserUtilizationByAccount:
each user in each account, most used first. TopUsage: the same, the first `TopCount`;
with `group`, one line a user, their accounts named together. Utilization: the
cluster's GPU time allocated, down, down for maintenance (PLND Down: nodes an operator
drained), idle and in all (Reported), from `muster.api.cluster_report`
(services/fairshare/cluster_report.py); Slurm's `Planned` column (idle time held for
pending jobs) is not kept, so it is not printed. SizesByAccount: each account's
allocated GPU time (or jobs, `printjobcount`) per job size in GPUs, from
`muster.api.sizes_report` (services/fairshare/sizes_report.py); its rows are one level,
as `flatview` asks. Anything else is refused with what to write instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import msgspec

from services.fairshare.sizes_report import DEFAULT_GROUPING, parse_grouping, range_names

UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0}
RULE = "-" * 80


class Report(StrEnum):
    """The reports kept, by Slurm's words (lower case)."""

    ACCOUNT_BY_USER = "cluster accountutilizationbyuser"
    USER_BY_ACCOUNT = "cluster userutilizationbyaccount"
    TOP_USAGE = "user topusage"
    UTILIZATION = "cluster utilization"
    SIZES = "job sizesbyaccount"


# Each report's columns (name, width) and title, as Slurm prints them.
COLUMNS = {
    Report.ACCOUNT_BY_USER: (("Cluster", 9), ("Account", 15), ("Login", 9),
                             ("Proper Name", 15), ("Used", 8), ("Energy", 8)),
    Report.USER_BY_ACCOUNT: (("Cluster", 9), ("Login", 9), ("Proper Name", 15),
                             ("Account", 15), ("Used", 8), ("Energy", 8)),
    Report.TOP_USAGE: (("Cluster", 9), ("Login", 9), ("Proper Name", 15), ("Account", 15),
                       ("Used", 8), ("Energy", 8)),
    Report.UTILIZATION: (("Cluster", 9), ("Allocated", 10), ("Down", 9), ("PLND Down", 9),
                         ("Idle", 9), ("Reported", 10)),
}  # fmt: skip
TITLES = {
    Report.ACCOUNT_BY_USER: "Cluster/Account/User Utilization",
    Report.USER_BY_ACCOUNT: "Cluster/User/Account Utilization",
    Report.TOP_USAGE: "Top {count} Users",
    Report.UTILIZATION: "Cluster Utilization",
    Report.SIZES: "Job Sizes",
}


class SreportError(ValueError):
    """A command line the shim cannot answer; the message says what to write."""


class SreportArgs(msgspec.Struct, frozen=True, kw_only=True):
    report: Report = Report.ACCOUNT_BY_USER
    unit: str = "minutes"  # Slurm's default
    delimiter: str | None = None  # -P / -p: "|"
    trailing: bool = False  # -p: a delimiter after the last field too
    header: bool = True  # -n: neither the title nor the column names
    since: float | None = None
    until: float | None = None
    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    top_count: int = 10  # user TopUsage: how many lines (TopCount=)
    group: bool = False  # user TopUsage: one line per user, their accounts together
    grouping: tuple[int, ...] = DEFAULT_GROUPING  # job SizesByAccount: the ranges' bounds
    job_count: bool = False  # job SizesByAccount: jobs, not time (printjobcount)


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
    named = " ".join(w.lower() for w in words[:2])
    if named not in {r.value for r in Report}:
        raise SreportError(
            f"report {' '.join(words[:2]) or '(none)'} is not kept: the reports are"
            " 'cluster AccountUtilizationByUser' (muster report gives the same),"
            " 'cluster UserUtilizationByAccount', 'cluster Utilization', 'user TopUsage'"
            " and 'job SizesByAccount'"
        )
    opts["report"] = Report(named)
    for word in words[2:]:
        opts |= _option(word, opts["report"], when)
    return SreportArgs(**opts)


def _option(word: str, report: Report, when: Callable[[str], float]) -> dict[str, Any]:
    """One of the report's words after its name (`start=`, `accounts=`, ...)."""
    key, _, value = word.partition("=")
    key = key.lower()
    if key in ("start", "end"):
        try:
            return {"since" if key == "start" else "until": when(value)}
        except (ValueError, TypeError) as err:
            raise SreportError(f"{word}: {err}") from err
    if report is Report.UTILIZATION:
        raise SreportError(f"{word}: the cluster's report takes start= and end= only")
    if report is Report.SIZES:
        return _sizes_option(word, key, value)
    if key in ("accounts", "account"):
        return {"accounts": tuple(v for v in value.split(",") if v)}
    if key in ("users", "user"):
        return {"users": tuple(v for v in value.split(",") if v)}
    if report is Report.TOP_USAGE and key == "topcount":
        if not value.isdigit() or int(value) < 1:
            raise SreportError(f"{word}: TopCount= takes a whole number, 1 or more")
        return {"top_count": int(value)}
    if report is Report.TOP_USAGE and key == "group" and not value:
        return {"group": True}
    if report is Report.ACCOUNT_BY_USER and key == "tree" and not value:
        return {}  # Slurm's tree display: the rows are in tree order already
    extra = {Report.TOP_USAGE: ", TopCount= and group", Report.ACCOUNT_BY_USER: " and tree"}
    raise SreportError(
        f"{word}: start=, end=, accounts=, users={extra.get(report, '')} are understood"
    )


def _sizes_option(word: str, key: str, value: str) -> dict[str, Any]:
    if key in ("accounts", "account"):
        return {"accounts": tuple(v for v in value.split(",") if v)}
    if key == "grouping":
        try:
            return {"grouping": parse_grouping(value)}
        except ValueError as err:
            raise SreportError(str(err)) from err
    if key == "printjobcount" and not value:
        return {"job_count": True}
    if key == "flatview" and not value:
        return {}  # the rows are one level already
    raise SreportError(
        f"{word}: start=, end=, accounts=, grouping=, printjobcount and flatview are understood"
    )


def sizes_lines(
    args: SreportArgs, cluster: str, since: float, until: float, grouping: Sequence[int],
    rows: Sequence[Any],
) -> list[str]:  # fmt: skip
    """job SizesByAccount's lines, from the sizes report's rows (`SizeRow`)."""
    per = UNITS[args.unit]
    names = range_names(grouping)
    columns = (("Cluster", 9), ("Account", 9), *((n, 13) for n in names), ("% of cluster", 12))
    cells = [
        [
            cluster,
            r.account,
            *(
                [str(n) for n in r.jobs]
                if args.job_count
                else [str(round(v / per)) for v in r.gpu_seconds]
            ),
            f"{100 * r.share:.2f}%",
        ]
        for r in rows
    ]
    unit = "Units are in number of jobs ran" if args.job_count else None
    return _lines(args, since, until, cells, columns, unit)


def lines(
    args: SreportArgs, cluster: str, since: float, until: float, rows: Sequence[Any]
) -> list[str]:
    """The report's lines: the title, the column names, then its rows, from the usage
    report's rows (`ReportRow`: an account's has user None)."""
    per = UNITS[args.unit]
    table = _table(args, cluster, rows)
    cells = [[*row[:4], str(round(row[4] / per)), "0"] for row in table]
    return _lines(args, since, until, cells, COLUMNS[args.report])


def cluster_lines(
    args: SreportArgs, cluster: str, since: float, until: float, usage: Any
) -> list[str]:
    """cluster Utilization's lines, from the cluster report (`ClusterUsage`)."""
    per = UNITS[args.unit]
    values = (usage.allocated_s, usage.down_s, usage.planned_down_s, usage.idle_s)
    cells = [[cluster, *(str(round(v / per)) for v in (*values, sum(values)))]]
    return _lines(args, since, until, cells, COLUMNS[args.report])


def _lines(
    args: SreportArgs, since: float, until: float, cells: list[list[str]],
    columns: Sequence[tuple[str, int]], unit: str | None = None,
) -> list[str]:  # fmt: skip
    out: list[str] = []
    if args.header:
        title = TITLES[args.report].format(count=args.top_count)
        out += [
            RULE,
            f"{title} {_time(since)} - {_time(until - 1)} ({round(until - since)} secs)",
            unit or f"Usage reported in GPU {args.unit.capitalize()}",
            RULE,
        ]
    names = [name for name, _ in columns]
    if args.delimiter is not None:
        end = args.delimiter if args.trailing else ""
        body = [names] if args.header else []
        return out + [args.delimiter.join(r) + end for r in [*body, *cells]]
    if args.header:
        out.append(" ".join(_fit(n, w) for n, w in columns))
        out.append(" ".join("-" * w for _, w in columns))
    return out + [" ".join(_fit(c, w) for c, (_, w) in zip(r, columns, strict=True)) for r in cells]


def _table(args: SreportArgs, cluster: str, rows: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Each line's cluster, its two name columns, proper name, and GPU-seconds."""
    if args.report is Report.ACCOUNT_BY_USER:  # root (the top level's sum), the tree
        top = sum(r.gpu_seconds for r in rows if r.user is None and r.depth == 1)
        return [(cluster, "root", "", "", top)] + [
            (cluster, r.account, r.user or "", "", r.gpu_seconds) for r in rows
        ]
    users = [r for r in rows if r.user is not None]  # each association once
    if args.report is Report.USER_BY_ACCOUNT:
        ranked = sorted(users, key=lambda r: (-r.gpu_seconds, r.user, r.account))
        return [(cluster, r.user, "", r.account, r.gpu_seconds) for r in ranked]
    if args.group:  # one line a user, their accounts named together
        by_user: dict[str, list[Any]] = {}
        for r in users:
            by_user.setdefault(r.user, []).append(r)
        lines_ = [
            (cluster, user, "", ",".join(sorted(r.account for r in mine)),
             sum(r.gpu_seconds for r in mine))
            for user, mine in by_user.items()
        ]  # fmt: skip
    else:
        lines_ = [(cluster, r.user, "", r.account, r.gpu_seconds) for r in users]
    return sorted(lines_, key=lambda t: (-t[4], t[1], t[3]))[: args.top_count]


def _fit(text: str, width: int) -> str:
    """Right-aligned in `width`; longer is cut with a `+`, as Slurm's columns are."""
    return text.rjust(width) if len(text) <= width else text[: width - 1] + "+"


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
