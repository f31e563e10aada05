"""Shell: Slurm's command names over Muster's API — `sbatch`, `squeue`, `scancel`,
`sinfo`, `sacct`, `scontrol`, `sshare`, `sreport` (muster/sreport.py), `sprio`
(muster/sprio.py), `seff` (muster/seff.py); `srun` (job steps, muster/steps.py) and
`salloc` (interactive allocations, muster/salloc.py).

`muster shims DIR` writes one small wrapper per name into DIR, each running
`muster.shims.main` with NAME ARGS (as `python -S`: muster/shim_script.py); nothing is
written over an existing file (a real Slurm's command, say) unless asked with `--force`.
The options and output formats are Slurm's; what they print is muster.slurm_format's.
Errors are one line, as Slurm's: `squeue: error: ...`, exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from muster import slurm_format as fmt
from muster.client import ApiRefused, current_user, nats_url, request
from muster.quiet import quietly
from shared.api import (
    JobSelector,
    JobView,
    NodeAction,
    NodesReply,
    Ok,
    QueueReply,
    QueueRequest,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
)

if TYPE_CHECKING:  # only write_shims takes a Path: a shim starts without site, or pathlib
    from pathlib import Path

NAMES = (
    "sbatch", "squeue", "scancel", "sinfo", "sacct", "scontrol", "sshare", "sreport", "sprio",
    "seff", "srun", "salloc",
)  # fmt: skip


class ShimError(Exception):
    """What the command prints after `NAME: error:` before it exits 1."""


def write_shims(folder: Path, force: bool = False, python: str = sys.executable) -> list[str]:
    """The wrappers written into `folder`; raises ShimError naming the files in the way."""
    folder.mkdir(parents=True, exist_ok=True)
    taken = [n for n in NAMES if (folder / n).exists() and not force]
    if taken:
        raise ShimError(
            f"{', '.join(taken)} already in {folder}; nothing written "
            "(--force replaces them, a real Slurm's included)"
        )
    from muster.shim_script import shim_text, site_paths  # how a wrapper starts fast

    paths = site_paths(python)
    for name in NAMES:
        path = folder / name
        path.write_text(shim_text(python, name, paths))
        path.chmod(0o755)
    return list(NAMES)


def _csv(values: Sequence[str] | None) -> tuple[str, ...]:
    return tuple(v for item in values or () for v in item.split(",") if v)


def _states(values: Sequence[str] | None) -> tuple[tuple[str, ...], bool]:
    """squeue's `-t`: long names or compact codes (`PD,R`), `all`."""
    return fmt.state_filter(_csv(values))


def _parser(name: str) -> argparse.ArgumentParser:
    # -h is Slurm's --noheader, so argparse's help is --help only
    p = argparse.ArgumentParser(prog=name, add_help=False)
    p.add_argument("--help", action="help")
    return p


def _url() -> str:
    return nats_url(os.environ.get("MUSTER_STATE_DIR"))


# --- sbatch ---------------------------------------------------------------------------


def sbatch(argv: list[str]) -> int:
    from muster.cli_jobs import submit_request
    from shared.sbatch_options import SBATCH_OWN, split_own

    split = split_own(argv, SBATCH_OWN)
    own = {g.name for g in split.own}
    options = [w for w in split.line.options if w != "-W"]
    wait = "wait" in own or len(options) < len(split.line.options)
    script = [] if split.line.script is None else ["--", split.line.script, *split.line.args]
    req = submit_request([*options, *script], dry_run=False)
    if isinstance(req, str):
        raise ShimError(req)
    req = replace(req, batch_first_node=True)  # Slurm's batch host: the first node
    url = _url()
    reply = request(url, "submit", req, SubmitReply)
    for warning in reply.warnings:
        print(f"sbatch: warning: {warning}", file=sys.stderr)
    if reply.spec is not None:  # --test-only: checked, not stored (nothing to wait for)
        print(fmt.checked_line(reply.spec), file=sys.stderr)
        return 0
    first = reply.job_ids[0]
    print(first if "parsable" in own else f"Submitted batch job {first}", flush=True)
    return _wait(url, reply.job_ids) if wait else 0


def _wait(url: str, job_ids: Sequence[int]) -> int:
    """sbatch --wait: until every job ended; the highest exit code, as sbatch returns."""
    from shared.states import TERMINAL

    req = QueueRequest(user=current_user(), job_ids=tuple(job_ids), all_states=True)
    while True:
        jobs = request(url, "queue", req, QueueReply).jobs
        if jobs and all(j.state in TERMINAL for j in jobs):
            codes = [j.exit_code or (0 if j.state == "COMPLETED" else 1) for j in jobs]
            return max(codes)
        time.sleep(1.0)


# --- squeue, scancel ------------------------------------------------------------------


def squeue(argv: list[str]) -> int:
    p = _parser("squeue")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-o", "--format")
    p.add_argument("-O", "--Format", dest="long_format")
    p.add_argument("-u", "--user", action="append")
    p.add_argument("--me", action="store_true")
    p.add_argument("-t", "--states", action="append")
    p.add_argument("-j", "--jobs", action="append")
    p.add_argument("-p", "--partition", action="append")
    p.add_argument("-A", "--account", action="append")
    p.add_argument("-n", "--name", action="append")
    p.add_argument("-a", "--all", action="store_true", help="accepted: every partition is shown")
    p.add_argument("-s", "--steps", action="store_true")
    p.add_argument("-r", "--array", action="store_true", help="a line per array task")
    p.add_argument("--start", action="store_true", help="pending jobs' expected starts")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-S", "--sort")
    p.add_argument("-i", "--iterate", type=float, help="print again every N seconds")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(_glued(argv, ("-S", "--sort")))
    if a.iterate is not None and a.iterate <= 0:
        raise ShimError(f"--iterate {a.iterate}: give a number of seconds above 0")
    while True:  # once, or every --iterate seconds until interrupted, as Slurm's
        _squeue_once(a)
        if a.iterate is None:
            return 0
        time.sleep(a.iterate)
        print()


def _glued(argv: list[str], options: Sequence[str]) -> list[str]:
    """`-S -i` read as Slurm's getopt reads it, the word after the option its value
    even when it starts with `-` (argparse would take `-i` for an option)."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        value = next(words, None) if word in options else None
        out.append(word if value is None else f"{options[-1]}={value}")
    return out


def _squeue_once(a: argparse.Namespace) -> None:
    states, all_states = _states(a.states or (["PENDING"] if a.start else None))
    if not (a.format or a.long_format):
        a.format = fmt.SQUEUE_START if a.start else fmt.SQUEUE_LONG if a.long else None
    req = QueueRequest(
        user=current_user(),
        users=_csv(a.user),
        mine=a.me,
        partitions=_csv(a.partition),
        states=states,
        all_states=all_states,
        job_refs=_csv(a.jobs),
        accounts=_csv(a.account),
        names=_csv(a.name),
        steps=a.steps,
        dependencies=fmt.asks_dependency(a.format, a.long_format),
    )
    reply = request(_url(), "queue", req, QueueReply)
    jobs = reply.jobs if a.sort is None else tuple(fmt.sort_jobs(reply.jobs, a.sort))
    if a.steps:  # a line per running srun step, as Slurm's squeue -s
        if a.long_format or a.json:
            raise ShimError("-s takes -o FORMAT (%i %j %P %u %M %A %N), not -O or --json")
        _print(fmt.step_lines(reply.steps, jobs, a.format, not a.noheader, time.time()))
        return
    if a.json:
        _print_json({"jobs": [_job_json(j) for j in jobs]})
        return
    if (a.long or a.iterate is not None) and not a.noheader:
        print(fmt.long_header(time.time()))
    _print(fmt.squeue_lines(jobs, a.format, a.long_format, not a.noheader, a.array))


def _job_json(j: JobView) -> dict[str, Any]:
    """One job as squeue --json names its fields (Slurm's data_parser)."""
    return {
        "job_id": j.job_id,
        "array_job_id": j.array_job_id or 0,
        "array_task_id": j.array_task_id,
        "name": j.name,
        "user_name": j.user,
        "account": j.account,
        "partition": j.partition,
        "qos": j.qos,
        "job_state": [j.state],
        "state_reason": j.reason.split(" ", 1)[0] or "None",
        "state_description": j.detail,
        "node_count": j.nodes,
        "nodes": fmt.compress(j.nodelist),
        "gpus": j.gpus,
        "time_limit": j.time_limit_s // 60,
        "submit_time": int(j.submitted_at),
        "start_time": int(j.started_at or 0),
        "end_time": int(j.ended_at or 0),
        "exit_code": j.exit_code,
        "restart_cnt": j.restart_count,
    }


def scancel(argv: list[str]) -> int:
    p = _parser("scancel")
    p.add_argument("job_ids", nargs="*")
    p.add_argument("-n", "--name", "--jobname")
    p.add_argument("-u", "--user")
    p.add_argument("--me", action="store_true")
    p.add_argument("-t", "--state", action="append")
    p.add_argument("-p", "--partition")
    p.add_argument("-s", "--signal")
    # A signal reaches an sbatch job's steps; -b its batch script, -f both (docs/steps.md)
    p.add_argument("-b", "--batch", action="store_true")
    p.add_argument("-f", "--full", action="store_true")
    a = p.parse_args(argv)
    if (a.batch or a.full) and not a.signal:
        raise ShimError("-b and -f say where a signal goes: give the signal, -s USR1")
    from shared.signal_scope import SignalScope

    scope = SignalScope.FULL if a.full else SignalScope.WORKER if a.batch else None
    states, _ = _states(a.state)
    owner, mine = a.user, a.me and not a.user  # --me: whoever signs, as the server knows
    if not (a.job_ids or a.name or owner or mine):
        raise ShimError("no job specification given: name job ids, -n NAME, -u USER or --me")
    from muster import step_refs  # JOB.STEP: the launcher ends the step

    steps, refs = step_refs.split(_csv(a.job_ids))
    if steps and scope is not None:
        raise ShimError("-b and -f say where a job's signal goes; JOB.STEP names the step")
    ended = step_refs.cancel(_url(), steps, "scancel", a.signal or "") if steps else 0
    if steps and not (refs or a.name or owner or mine):
        return ended
    return ended | _act(
        "scancel",
        "cancel",
        refs,
        name=a.name,
        owner=owner,
        mine=mine,
        states=states,
        partition=a.partition,
        signal=a.signal,
        signal_scope=scope,
    )


def _act(shim: str, verb: str, refs: Sequence[str], **selector: Any) -> int:
    sel = JobSelector(user=current_user(), job_refs=_csv(refs), **selector)
    reply = request(_url(), verb, sel, Ok)
    for why in reply.skipped:
        print(f"{shim}: error: {why}", file=sys.stderr)
    return 1 if reply.skipped and not reply.job_ids else 0


# --- sinfo, sacct, sshare -------------------------------------------------------------


def sinfo(argv: list[str]) -> int:
    p = _parser("sinfo")
    p.add_argument("-N", "--Node", action="store_true")
    p.add_argument("-s", "--summarize", action="store_true")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-o", "--format")
    p.add_argument("-n", "--nodes")
    p.add_argument("-p", "--partition", action="append")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-R", "--list-reasons", dest="reasons", action="store_true")
    p.add_argument("-T", "--reservation", action="store_true")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    reply = request(_url(), "nodes", QueueRequest(user=current_user()), NodesReply)
    if a.reservation:  # Slurm's `sinfo -T`: a line per reservation
        _print(fmt.reservation_table(reply.reservations, time.time(), not a.noheader))
        return 0
    nodes, parts = reply.nodes, reply.partitions
    if a.nodes:
        wanted = set(_csv([a.nodes]))
        nodes = tuple(n for n in nodes if n.name in wanted)
    if a.partition:
        parts = tuple(p for p in _csv(a.partition) if p in parts or not parts)
        nodes = tuple(
            replace(n, partitions=tuple(p for p in n.partitions if p in parts))
            for n in nodes
            if set(n.partitions) & set(parts)
        )
    if a.json:
        from muster.render import to_json

        print(to_json(replace(reply, nodes=nodes, partitions=parts)))
        return 0
    widest = {v.name: v.max_nodes for v in reply.partition_views if v.max_nodes is not None}
    lines = fmt.sinfo_lines(
        nodes, a.format, a.Node, not a.noheader, parts, reply.default_partition,
        reply.time_limits, summarize=a.summarize, long=a.long, max_nodes=widest,
        reasons=a.reasons,
    )  # fmt: skip
    if a.long and not a.noheader:
        print(fmt.long_header(time.time()))
    _print(lines)
    return 0


def sacct(argv: list[str]) -> int:
    from services.fairshare.api import ACCT_VERB, AcctReply, AcctRequest

    p = _parser("sacct")
    p.add_argument("-j", "--jobs", action="append")
    p.add_argument("-o", "--format")
    p.add_argument("-u", "--user", action="append")
    p.add_argument("-A", "--accounts", action="append")
    p.add_argument("-s", "--state", action="append")
    p.add_argument("-X", "--allocations", action="store_true")
    p.add_argument("-D", "--duplicates", action="store_true")
    p.add_argument("-n", "--noheader", action="store_true")
    p.add_argument("-P", "--parsable2", action="store_true")
    p.add_argument("-p", "--parsable", action="store_true")
    p.add_argument("-a", "--allusers", action="store_true")
    p.add_argument("-S", "--starttime")
    p.add_argument("-E", "--endtime")
    p.add_argument("--name", action="append")
    p.add_argument("-r", "--partition", action="append")
    p.add_argument("-b", "--brief", action="store_true")
    a = p.parse_args(argv)
    if a.brief and not a.format:  # Slurm's -b: the job, how it ended, its exit code
        a.format = "JobID,State,ExitCode"
    try:
        refs = _acct_refs(_csv(a.jobs)) if a.jobs else []
    except ValueError as err:
        raise ShimError(f"bad job id in -j {','.join(a.jobs)}: {err}") from err
    from datetime import datetime

    from muster.acct_window import WindowError, acct_window

    try:  # Slurm's: local time, the past; since midnight unless -j names jobs
        local = datetime.now().astimezone().tzinfo
        assert local is not None
        since, until = acct_window(
            a.starttime, a.endtime, by_job=bool(refs), now=time.time(), tz=local
        )
    except WindowError as err:
        raise ShimError(str(err)) from err
    req = AcctRequest(
        since=since,
        until=until,
        user=current_user(),
        job_ids=tuple(dict.fromkeys(job for job, _ in refs)),
        users=_csv(a.user),
        accounts=_csv(a.accounts),
        states=tuple(s.upper() for s in _csv(a.state)),
        attempts=a.duplicates,  # requeued runs, as sacct -D lists them
        steps=not a.allocations,  # JOB.STEP records, as sacct lists srun's steps
    )
    rows = fmt.oldest_first(request(_url(), ACCT_VERB, req, AcctReply).rows)
    names, parts = set(_csv(a.name)), set(_csv(a.partition))
    if names or parts:  # --name, -r: of the rows the window and selection gave
        rows = tuple(
            r
            for r in rows
            if (not names or r.name in names) and (not parts or r.partition in parts)
        )
    named = {job: {s for j, s in refs if j == job} for job, _ in refs}
    if any(None not in steps for steps in named.values()):  # -j 12.3: that step alone
        rows = tuple(
            r for r in rows if None in named.get(r.job_id, {None}) or r.step in named[r.job_id]
        )
    delimiter = "|" if a.parsable or a.parsable2 else None
    lines = fmt.sacct_lines(rows, a.format, header=not a.noheader, delimiter=delimiter)
    if missing := fmt.unrecorded(a.format):
        print(f"sacct: {', '.join(missing)}: not recorded by Muster, shown empty", file=sys.stderr)
    _print([f"{line}|" for line in lines] if a.parsable else lines)
    return 0


def _acct_refs(words: tuple[str, ...]) -> list[tuple[int, int | None]]:
    """`-j` words as (job id, step): `12`, `12.3` (a step), `12.batch` (the job); an
    array's tasks by their own ids, as the queue resolves `12` (a job, or every task of
    array 12), `12_3` and `12_[1-3]`."""
    refs: list[tuple[int, int | None]] = []
    for word in words:
        base, _, step = word.partition(".")
        if "_" not in base:
            refs.append((int(base), int(step) if step.isdigit() else None))
    tasks = _named(tuple(dict.fromkeys(w.partition(".")[0] for w in words)))
    refs += [(j.job_id, None) for j in tasks if j.array_job_id is not None]
    return list(dict.fromkeys(refs))


def _named(refs: tuple[str, ...]) -> tuple[JobView, ...]:
    """The jobs Slurm-style `refs` name, in any state, as the queue resolves them: `12`
    (a job, or every task of array 12), `12_3`, `12_[1-3]`."""
    ask = QueueRequest(user=current_user(), job_refs=refs, all_states=True)
    return request(_url(), "queue", ask, QueueReply).jobs


def seff(argv: list[str]) -> int:
    """How much of its --mem a job used, in seff's lines (muster/seff.py)."""
    from muster.client_env import local_ids
    from muster.seff import seff_lines
    from services.fairshare.api import ACCT_VERB, AcctReply, AcctRequest

    p = _parser("seff")
    p.add_argument("job")
    a = p.parse_args(argv)
    if "." in a.job:
        raise ShimError(f"{a.job}: seff reports a job, not a step; give {a.job.split('.')[0]}")
    if "_" in a.job:  # an array task, ARRAY_TASK: its own job id
        found = _named((a.job,))
        if len(found) != 1:
            raise ShimError(f"Job not found: {a.job}")
        job = found[0].job_id
    elif a.job.isdigit():
        job = int(a.job)
    else:
        raise ShimError(f"bad job id {a.job}: seff takes one job id, e.g. 12 or 12_3")
    req = AcctRequest(user=current_user(), job_ids=(job,), attempts=False)
    rows = [r for r in request(_url(), ACCT_VERB, req, AcctReply).rows if r.step is None]
    if not rows:
        raise ShimError(f"Job not found: {job}")
    ids = local_ids(rows[0].user)
    group = ids[1] if ids is not None else rows[0].account
    _print(seff_lines(rows[0], group, "muster", time.time()))
    return 0


def sshare(argv: list[str]) -> int:
    from services.fairshare.api import SHARE_VERB, ShareReply, ShareRequest
    from services.fairshare.render import render_share_table

    p = _parser("sshare")
    p.add_argument("-A", "--accounts", action="append")
    p.add_argument("-u", "--users", action="append")
    p.add_argument("-a", "--all", action="store_true")
    p.add_argument("-l", "--long", action="store_true")
    a = p.parse_args(argv)
    req = ShareRequest(user=current_user(), accounts=_csv(a.accounts), users=_csv(a.users))
    print(render_share_table(request(_url(), SHARE_VERB, req, ShareReply).rows))
    return 0


def sreport(argv: list[str]) -> int:
    from muster import sreport as report
    from services.fairshare.api import (
        CLUSTER_VERB,
        REPORT_VERB,
        SIZES_VERB,
        ClusterReply,
        ClusterRequest,
        ReportReply,
        ReportRequest,
        SizesReply,
        SizesRequest,
    )

    try:
        a = report.parse(argv, _when)
    except report.SreportError as err:
        raise ShimError(str(err)) from err
    if a.report is report.Report.SIZES:
        sizes = SizesRequest(
            user=current_user(), since=a.since, until=a.until, accounts=a.accounts,
            grouping=a.grouping,
        )  # fmt: skip
        by = request(_url(), SIZES_VERB, sizes, SizesReply)
        _print(report.sizes_lines(a, by.cluster, by.since, by.until, by.grouping, by.rows))
        return 0
    if a.report is report.Report.UTILIZATION:
        ask = ClusterRequest(user=current_user(), since=a.since, until=a.until)
        got = request(_url(), CLUSTER_VERB, ask, ClusterReply)
        _print(report.cluster_lines(a, got.cluster, got.since, got.until, got.usage))
        return 0
    req = ReportRequest(
        user=current_user(), since=a.since, until=a.until, accounts=a.accounts, users=a.users
    )
    reply = request(_url(), REPORT_VERB, req, ReportReply)
    _print(report.lines(a, reply.cluster, reply.since, reply.until, reply.rows))
    return 0


def sprio(argv: list[str]) -> int:
    """Each pending job's priority and its factors (muster/sprio.py)."""
    from muster.sprio import sprio_lines

    p = _parser("sprio")
    p.add_argument("-j", "--jobs", action="append")
    p.add_argument("-u", "--user", action="append")
    p.add_argument("-p", "--partition", action="append")
    p.add_argument("-l", "--long", action="store_true")
    p.add_argument("-h", "--noheader", action="store_true")
    p.add_argument("-o", "--format")
    p.add_argument("-w", "--weights", action="store_true")
    a = p.parse_args(argv)
    if a.weights:
        raise ShimError(
            "-w: the weights are the fairshare service's [priority] table (docs/fairshare.md);"
            " `muster show job ID` gives one job's weighted parts"
        )
    req = QueueRequest(
        user=current_user(),
        users=_csv(a.user),
        partitions=_csv(a.partition),
        job_refs=_csv(a.jobs),
        states=("PENDING",),
        priorities=True,
    )
    jobs = request(_url(), "queue", req, QueueReply).jobs
    _print(sprio_lines(jobs, a.format, a.long, not a.noheader))
    return 0


def _when(text: str) -> float:
    """sreport's start=/end=: a date, a date and time (UTC) or epoch seconds."""
    from muster.cli_accounting import parse_when

    try:
        return parse_when(text)
    except argparse.ArgumentTypeError as err:
        raise ValueError(str(err)) from err


# --- scontrol -------------------------------------------------------------------------


# scontrol's options before its command: one line a record (-o), more detail (-d:
# everything is shown already), every partition (-a: none is hidden)
SCONTROL_FLAGS = {"-o": "oneliner", "--oneliner": "oneliner", "-d": "", "--details": "",
                  "-dd": "", "-a": "", "--all": ""}  # fmt: skip


def scontrol(argv: list[str]) -> int:
    from muster.hostnames import ENTITIES

    flags = {SCONTROL_FLAGS[w] for w in argv if w in SCONTROL_FLAGS}
    argv = [w for w in argv if w not in SCONTROL_FLAGS]
    one_line = "oneliner" in flags
    what = argv[1].lower() if argv[:1] == ["show"] and len(argv) >= 2 else ""
    if what in ENTITIES:
        return _show_hosts(what, argv[2:])
    if what in ("job", "jobs", "jobid"):
        return _show_jobs(argv[2] if len(argv) > 2 else None, one_line)
    if what in ("node", "nodes"):
        return _show_nodes(argv[2] if len(argv) > 2 else None, one_line)
    if what in ("partition", "partitions"):
        return _show_partitions(argv[2] if len(argv) > 2 else None, one_line)
    if what in ("reservation", "reservations", "res"):
        return _show_reservations(argv[2] if len(argv) > 2 else None, one_line)
    if argv[:1] in (["hold"], ["release"], ["requeue"]) and len(argv) >= 2:
        return _act("scontrol", argv[0], argv[1:])
    if argv[:1] == ["update"] and len(argv) >= 2:
        return _update(argv[1:])
    if argv[:1] == ["requeuehold"] and len(argv) >= 2:
        # Slurm's `requeuehold [State=SpecialExit] IDS`: back in the queue, held until
        # `scontrol release` (a special exit state is a hold all the same here)
        refs = [w for w in argv[1:] if not w.lower().startswith("state=")]
        return _act("scontrol", "requeue", refs, hold=True)
    raise ShimError(
        f"unsupported: scontrol {' '.join(argv) or '(nothing)'}; this shim knows "
        "[-o] show job [ID], show node [NAME], show partition [NAME],"
        " show reservation [NAME], show hostnames [LIST], show hostlist[sorted] NAMES,"
        " hold IDS, release IDS, requeue IDS, requeuehold IDS,"
        " update JobId=ID [TimeLimit=] [Nice=] [JobName=] [Comment=],"
        " update NodeName=NODES State=DRAIN|RESUME [Reason=]"
    )


def _show_hosts(entity: str, args: list[str]) -> int:
    """`scontrol show hostnames [LIST]` and `show hostlist[sorted] NAMES`, from the
    arguments alone (muster/hostnames.py)."""
    from pathlib import Path

    from muster.hostnames import HostlistError, show

    try:
        lines = show(entity, args, os.environ, lambda path: Path(path).read_text())
    except HostlistError as err:
        raise ShimError(str(err)) from err
    _print(lines)
    return 0


def _update(words: list[str]) -> int:
    from muster.scontrol_update import UpdateError, is_node_update, update_request

    if is_node_update(words):
        return _update_nodes(words)
    try:
        req = update_request(words, current_user())
    except UpdateError as err:
        raise ShimError(str(err)) from err
    reply = request(_url(), "update", req, Ok)
    for why in reply.skipped:
        print(f"scontrol: {why}", file=sys.stderr)
    return 0


def _update_nodes(words: list[str]) -> int:
    """`scontrol update NodeName=... State=DRAIN|RESUME Reason=...`: a drain or resume
    asked for each node named, as `muster drain` asks it (operators alone may); silent
    on success, as Slurm's."""
    from muster.scontrol_update import UpdateError, node_update

    try:
        update = node_update(words)
    except UpdateError as err:
        raise ShimError(str(err)) from err
    url, user = _url(), current_user()
    for node in update.nodes:
        request(url, update.verb, NodeAction(user=user, node=node, reason=update.reason), Ok)
    return 0


def _show_jobs(ref: str | None, one_line: bool) -> int:
    """`scontrol show job [ID]`: the job (an array's id: every task of it, as Slurm's),
    or every job the queue shows (as Slurm's, those not yet purged: the live ones), a
    record each with a blank line after."""
    from muster.client_env import local_ids
    from muster.render import show_lines

    url, user = _url(), current_user()
    if ref is None:
        live = request(url, "queue", QueueRequest(user=user), QueueReply).jobs
        job_ids = [j.job_id for j in live]
        if not job_ids:
            print("No jobs in the system")
    elif ref.isdigit():
        first = request(url, "show", ShowJobRequest(user=user, job_id=int(ref)), ShowJobReply)
        if first.job.array_job_id != int(ref):  # a job, or one task by its own id
            _record(show_lines(first, local_ids(first.job.user)), one_line)
            return 0
        job_ids = [j.job_id for j in _named((ref,))]  # every task
    else:
        jobs = _named((ref,))
        if len(jobs) != 1:
            raise ShimError(f"{ref} names {len(jobs)} jobs; give one job id")
        job_ids = [jobs[0].job_id]
    for job_id in job_ids:
        reply = request(url, "show", ShowJobRequest(user=user, job_id=job_id), ShowJobReply)
        _record(show_lines(reply, local_ids(reply.job.user)), one_line)
    return 0


def _record(lines: list[str], one_line: bool) -> None:
    """One record of `scontrol show`: its lines, or with -o one line, then a blank."""
    _print([" ".join(line.strip() for line in lines)] if one_line else lines)
    print()


def _show_nodes(name: str | None, one_line: bool) -> int:
    nodes = request(_url(), "nodes", QueueRequest(user=current_user()), NodesReply).nodes
    chosen = [n for n in nodes if name is None or n.name == name]
    if not chosen:
        raise ShimError(f"Node {name} not found")
    for n in chosen:
        gres = fmt.NODE_COLUMNS["gres"][1](n)
        lines = [
            f"NodeName={n.name} State={fmt.node_state(n).upper()} Gres={gres}"
            f" GresUsed=gpu:{n.gpus_total - n.gpus_free}",
            f"   CPUAlloc={min(n.cpus_alloc, n.cpus) if n.cpus else n.cpus_alloc}"
            f" CPUTot={n.cpus or 'N/A'} RealMemory={n.memory_mib or 'N/A'}"
            f" AllocMem={n.mem_alloc_mib}"
            f" AvailableFeatures={','.join(n.features) or '(null)'}"
            f" Partitions={','.join(n.partitions) or '(null)'}"
            f" Switches={'/'.join(n.topology) or '(null)'}",
            f"   Reason={n.reason or '(null)'}",
        ]
        _record(lines, one_line)
    return 0


def _show_partitions(name: str | None, one_line: bool) -> int:
    """`scontrol show partition [NAME]`: each partition's nodes, GPUs, longest time
    limit and whether it is the default (muster/render.py: partition_lines)."""
    from muster.render import partition_lines

    reply = request(_url(), "nodes", QueueRequest(user=current_user()), NodesReply)
    if name is not None and name not in reply.partitions:
        raise ShimError(f"Partition {name} not found")
    for part in reply.partitions:
        if name is None or part == name:
            _record(partition_lines(reply, part), one_line)
    return 0


def _show_reservations(name: str | None, one_line: bool) -> int:
    """`scontrol show reservation [NAME]`: each reservation and maintenance window of
    the configuration, its window open now or next (muster/render.py)."""
    from muster.render import reservation_lines

    found = request(_url(), "nodes", QueueRequest(user=current_user()), NodesReply).reservations
    chosen = [r for r in found if name is None or r.name == name]
    if name is not None and not chosen:
        raise ShimError(f"Reservation {name} not found")
    if not chosen:
        print("No reservations in the system")
    now = time.time()
    for view in chosen:
        _record(reservation_lines(view, now), one_line)
    return 0


# --- srun, salloc ---------------------------------------------------------------------


def srun(argv: list[str]) -> int:
    from muster import steps  # job steps (docs/steps.md)

    return steps.main(argv)


def salloc(argv: list[str]) -> int:
    from muster import salloc as interactive  # interactive allocations (docs/steps.md)

    return interactive.main(argv)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "sbatch": sbatch,
    "squeue": squeue,
    "scancel": scancel,
    "sinfo": sinfo,
    "sacct": sacct,
    "scontrol": scontrol,
    "sshare": sshare,
    "sreport": sreport,
    "sprio": sprio,
    "seff": seff,
    "srun": srun,
    "salloc": salloc,
}


def _print(lines: list[str]) -> None:
    if lines:
        print("\n".join(lines))


def _print_json(value: Any) -> int:
    import json

    print(json.dumps(value, indent=2, sort_keys=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if not words or words[0] not in COMMANDS:
        print(f"usage: python -m muster.shims {{{','.join(NAMES)}}} ARGS", file=sys.stderr)
        return 2
    name, rest = words[0], words[1:]

    def run() -> int:
        try:
            return COMMANDS[name](rest)
        except (ShimError, ApiRefused, fmt.FormatError) as err:
            print(f"{name}: error: {err}", file=sys.stderr)
            return 1

    return quietly(run)


if __name__ == "__main__":
    sys.exit(main())
