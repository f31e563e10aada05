"""Shell: `muster share` (like sshare), `muster acct` (like sacct) and `muster report`
(like sreport), answered by the fairshare service over NATS. `muster.cli` calls
`register(subparsers)`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import msgspec

from muster.client import ApiRefused, current_user, nats_url, request


def _names(values: list[str] | None) -> tuple[str, ...]:
    """`-u a,b -u c` -> ("a", "b", "c")."""
    return tuple(n for v in values or () for n in v.split(",") if n)


def parse_when(text: str) -> float:
    """Epoch seconds from `2027-01-15`, `2027-01-15T08:00[:00]` (UTC unless an offset
    is given) or a plain number of epoch seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time; write 2027-01-15, 2027-01-15T08:00 or epoch seconds"
        ) from err
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _answer(
    verb: str, req: msgspec.Struct, kind: type[Any], args: argparse.Namespace,
    render: Callable[[Any], str],
) -> int:  # fmt: skip
    """Ask fairshare; print its reply as JSON (`--json`) or as `render` writes it."""
    try:
        reply = request(nats_url(args.state), verb, req, kind)
    except ApiRefused as err:  # unreachable, no fairshare service, a refusal: one line
        print(f"muster {verb}: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(reply).decode(), indent=2))
    else:
        print(render(reply))
    return 0


def cmd_share(args: argparse.Namespace) -> int:
    # the fairshare contracts load with the two commands that use them, not every call
    from services.fairshare.api import SHARE_VERB, ShareReply, ShareRequest
    from services.fairshare.render import render_share_table

    req = ShareRequest(user=current_user(), accounts=_names(args.account), users=_names(args.user))
    return _answer(SHARE_VERB, req, ShareReply, args, lambda r: render_share_table(r.rows))


def cmd_acct(args: argparse.Namespace) -> int:
    from services.fairshare.api import ACCT_VERB, AcctReply, AcctRequest
    from services.fairshare.render import render_acct

    req = AcctRequest(
        user=current_user(),
        job_ids=tuple(int(j) for j in _names(args.jobs)),
        users=_names(args.user),
        accounts=_names(args.account),
        states=tuple(s.upper() for s in _names(args.state_filter)),
        since=args.starttime,
        until=args.endtime,
        attempts=not args.allocations,
        steps=not args.allocations,
        limit=args.limit,
    )
    return _answer(ACCT_VERB, req, AcctReply, args, lambda r: render_acct(r.rows))


def cmd_report(args: argparse.Namespace) -> int:
    from services.fairshare.api import REPORT_VERB, ReportReply, ReportRequest
    from services.fairshare.report import TimeUnit, render_report

    if args.cluster and args.sizes:
        print("muster report: give --cluster or --sizes, not both", file=sys.stderr)
        return 2
    if args.cluster:
        return _cluster_report(args)
    if args.sizes:
        return _sizes_report(args)
    req = ReportRequest(
        user=current_user(),
        since=args.starttime,
        until=args.endtime,
        accounts=_names(args.account),
        users=_names(args.user),
        by_user=not args.accounts_only,
    )
    unit = TimeUnit(args.time_unit)
    return _answer(
        REPORT_VERB, req, ReportReply, args, lambda r: render_report(r.rows, r.since, r.until, unit)
    )


def _cluster_report(args: argparse.Namespace) -> int:
    """`muster report --cluster`: the cluster's GPU time per state (sreport's cluster
    Utilization); per-account options do not apply."""
    from services.fairshare.api import CLUSTER_VERB, ClusterReply, ClusterRequest
    from services.fairshare.cluster_report import render_cluster
    from services.fairshare.report import TimeUnit

    if args.account or args.user or args.accounts_only:
        print(
            "muster report: --cluster reports the whole cluster's GPU time;"
            " drop -A, -u and --accounts-only (or drop --cluster for usage per account)",
            file=sys.stderr,
        )
        return 2
    req = ClusterRequest(user=current_user(), since=args.starttime, until=args.endtime)
    unit = TimeUnit(args.time_unit)
    return _answer(
        CLUSTER_VERB,
        req,
        ClusterReply,
        args,
        lambda r: render_cluster(r.usage, r.since, r.until, unit),
    )


def _sizes_report(args: argparse.Namespace) -> int:
    """`muster report --sizes`: allocated GPU time by job size per account (sreport's
    job SizesByAccount); rows are accounts, so user options do not apply."""
    from services.fairshare.api import SIZES_VERB, SizesReply, SizesRequest
    from services.fairshare.report import TimeUnit
    from services.fairshare.sizes_report import DEFAULT_GROUPING, parse_grouping, render_sizes

    if args.user or args.accounts_only:
        print(
            "muster report: --sizes has a row per account; drop -u and --accounts-only",
            file=sys.stderr,
        )
        return 2
    try:
        grouping = parse_grouping(args.grouping) if args.grouping else DEFAULT_GROUPING
    except ValueError as err:
        print(f"muster report: {err}", file=sys.stderr)
        return 2
    req = SizesRequest(
        user=current_user(),
        since=args.starttime,
        until=args.endtime,
        accounts=_names(args.account),
        grouping=grouping,
    )
    unit = TimeUnit(args.time_unit)
    return _answer(
        SIZES_VERB,
        req,
        SizesReply,
        args,
        lambda r: render_sizes(
            r.rows, r.grouping, r.since, r.until, unit, job_counts=args.job_counts
        ),
    )


def register(sub: Any) -> None:
    """Add `share`, `acct` and `report` to the `muster` parser's subcommands."""
    s = sub.add_parser("share", help="fair share per account and user (like sshare -l)")
    s.add_argument("-A", "--account", action="append", help="only these accounts (a,b)")
    s.add_argument("-u", "--user", action="append", help="only these users (a,b)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_share)

    s = sub.add_parser("acct", help="job accounting records (like sacct)")
    s.add_argument("-j", "--jobs", action="append", help="job ids (12,13)")
    s.add_argument("-u", "--user", action="append", help="users (a,b)")
    s.add_argument("-A", "--account", action="append", help="accounts (a,b)")
    s.add_argument("-s", "--state", dest="state_filter", action="append", help="states")
    s.add_argument("-S", "--starttime", type=parse_when, help="running or ended since")
    s.add_argument("-E", "--endtime", type=parse_when, help="submitted before")
    s.add_argument(
        "-X", "--allocations", action="store_true", help="jobs alone: no attempts, no steps"
    )
    s.add_argument("--limit", type=int, default=1000)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_acct)

    s = sub.add_parser("report", help="GPU time used per account and user (like sreport)")
    s.add_argument("-S", "--starttime", type=parse_when, help="from (default: yesterday)")
    s.add_argument(
        "-E", "--endtime", type=parse_when, help="until (default: now, or today 00:00 without -S)"
    )
    s.add_argument("-A", "--account", action="append", help="only these accounts (a,b)")
    s.add_argument("-u", "--user", action="append", help="only these users (a,b)")
    s.add_argument("--accounts-only", action="store_true", help="no user rows")
    s.add_argument(
        "--sizes",
        action="store_true",
        help="allocated GPU time by job size per account (sreport job SizesByAccount)",
    )
    s.add_argument("--grouping", help="with --sizes: the size ranges' bounds (8,64,256)")
    s.add_argument("--job-counts", action="store_true", help="with --sizes: jobs, not time")
    s.add_argument(
        "--cluster",
        action="store_true",
        help="the cluster's GPU time: allocated, idle, planned down, down (sreport cluster"
        " Utilization)",
    )
    s.add_argument("-t", "--time-unit", choices=("seconds", "minutes", "hours"), default="hours")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_report)
