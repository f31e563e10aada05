"""Shell: the job commands of `muster` (submit, queue, show, cancel, hold, release,
approve, reload), one admission request each; `muster.cli` calls `register(subparsers)`.
What they print is `muster.render`'s."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from muster import render
from muster.client import ApiRefused, current_user, nats_url, refused, request
from muster.client_env import local_ids
from muster.lean_request import submit_fields
from shared.api import (
    JobSelector,
    Ok,
    QueueReply,
    QueueRequest,
    ReloadReply,
    Request,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
    UpdateRequest,
)


def _print(lines: list[str]) -> None:
    print("\n".join(lines))


def submit_request(words: list[str], dry_run: bool) -> SubmitRequest | str:
    """The submit request from the command line and the script file, or what is wrong
    (its fields are the lean `muster submit`'s: one way to read them)."""
    fields = submit_fields(words, dry_run)
    return fields if isinstance(fields, str) else SubmitRequest(**fields)


def cmd_submit(args: argparse.Namespace) -> int:
    req = submit_request(args.words, args.dry_run)
    if isinstance(req, str):
        print(f"muster submit: {req}", file=sys.stderr)
        return 2
    try:
        reply = request(nats_url(args.state), "submit", req, SubmitReply)
    except ApiRefused as err:
        return refused("submit", err)
    for warning in reply.warnings:
        print(f"muster submit: warning: {warning}", file=sys.stderr)
    if args.json:
        print(render.to_json(reply))
    elif reply.spec is not None:
        import json

        print(json.dumps(reply.spec, indent=2))
    elif len(reply.job_ids) == 1:
        print(f"Submitted batch job {reply.job_ids[0]}")
    else:
        print(f"Submitted array job {reply.job_ids[0]} ({len(reply.job_ids)} tasks)")
    return 0


def _csv(values: list[str] | None) -> tuple[str, ...]:
    """`-u a,b -u c` -> (a, b, c), as squeue takes lists."""
    return tuple(v for item in values or () for v in item.split(",") if v)


def cmd_queue(args: argparse.Namespace) -> int:
    req = QueueRequest(
        user=current_user(),
        users=_csv(args.user),
        partitions=_csv(args.partition),
        states=tuple(s.upper() for s in _csv(args.state_filter)),
        all_states=args.all,
        job_refs=_csv(args.jobs),
        accounts=_csv(args.account),
        names=_csv(args.name),
    )
    reply = request(nats_url(args.state), "queue", req, QueueReply)
    if args.json:
        print(render.to_json(reply))
    else:
        _print(render.queue_lines(reply, start=args.start))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    url = nats_url(args.state)
    try:
        job_id = _one_job_id(url, args.job_id)
        reply = request(
            url, "show", ShowJobRequest(user=current_user(), job_id=job_id), ShowJobReply
        )
    except ApiRefused as err:
        return refused("show", err)
    if args.json:
        print(render.to_json(reply))
    else:
        _print(render.show_lines(reply, local_ids(reply.job.user)))
    return 0


def _one_job_id(url: str, ref: str) -> int:
    """`123` or `123_4` (an array task) -> the job id `show` takes."""
    if ref.isdigit():
        return int(ref)
    req = QueueRequest(user=current_user(), job_refs=(ref,), all_states=True)
    jobs = request(url, "queue", req, QueueReply).jobs
    if len(jobs) != 1:
        raise ApiRefused(f"{ref} names {len(jobs)} jobs; give one job id", "not_found", ())
    return jobs[0].job_id


def _selector(args: argparse.Namespace) -> JobSelector:
    return JobSelector(
        user=current_user(),
        job_refs=_csv(args.job_ids),
        name=args.name,
        owner=args.owner,
        signal=getattr(args, "signal", None),  # only cancel takes -s
        reason=args.reason or "",
        states=tuple(s.upper() for s in _csv(args.state_filter)),
        partition=args.partition,
        hold=getattr(args, "hold", False),  # only requeue takes --hold
    )


def _job_action(verb: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        ended = 0  # 1 once a step named was refused
        if verb == "cancel":  # JOB.STEP: the launcher ends the step (muster/step_refs.py)
            from muster import step_refs

            refs = list(_csv(args.job_ids))
            steps, args.job_ids = step_refs.split(refs)
            url, sig = nats_url(args.state), args.signal or ""
            ended = step_refs.cancel(url, steps, "muster cancel", sig) if steps else 0
            if steps and not (args.job_ids or args.name or args.owner):
                return ended
        try:
            reply = request(nats_url(args.state), verb, _selector(args), Ok)
        except ApiRefused as err:
            return refused(verb, err)
        _said(reply, args.json)
        return 0 if args.json else ended

    return run


def cmd_update(args: argparse.Namespace) -> int:
    """`muster update JOB... --time T --nice N --name X --comment C` (scontrol update)."""
    from services.admission.values import limit_update, nice

    try:
        limit, change = (None, None) if args.time is None else limit_update(args.time, "--time")
        niceness = None if args.nice is None else nice(args.nice)
    except ValueError as err:
        print(f"muster update: {err}", file=sys.stderr)
        return 2
    req = UpdateRequest(
        user=current_user(),
        job_refs=_csv(args.job_ids),
        time_limit_s=limit,
        time_limit_change_s=change,
        nice=niceness,
        name=args.job_name,
        comment=args.comment,
        partition=args.partition,
        qos=args.qos,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        exclude=args.exclude,
        constraint=args.constraint,
        begin=args.begin,
        dependency=args.dependency,
        nodelist=args.nodelist,
        account=args.account,
        array_throttle=args.array_throttle,
    )
    try:
        reply = request(nats_url(args.state), "update", req, Ok)
    except ApiRefused as err:
        return refused("update", err)
    _said(reply, args.json)
    return 0


def _said(reply: Ok, as_json: bool) -> None:
    """What an action did: its reply as JSON, or its message and each job it skipped."""
    if as_json:
        print(render.to_json(reply))
        return
    print(reply.message)
    for why in reply.skipped:
        print(f"  skipped: {why}")


def cmd_reload(args: argparse.Namespace) -> int:
    try:
        reply = request(nats_url(args.state), "reload", Request(user=current_user()), ReloadReply)
    except ApiRefused as err:
        return refused("reload", err)
    if args.json:
        print(render.to_json(reply))
    else:
        print(f"{reply.message} (partitions: {', '.join(reply.partitions) or 'none'})")
    return 0


def register(sub: Any) -> None:
    """Add the job commands to the `muster` parser's subcommands."""
    s = sub.add_parser(
        "submit", help="submit a batch script (sbatch options and #SBATCH directives)"
    )
    s.add_argument("--dry-run", action="store_true")
    s.add_argument("--json", action="store_true")
    s.add_argument("words", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_submit)

    s = sub.add_parser("queue", help="list jobs (like squeue)")
    s.add_argument("-u", "--user", action="append", help="users (comma list)")
    s.add_argument("-p", "--partition", action="append", help="partitions (comma list)")
    s.add_argument("-t", "--states", dest="state_filter", action="append", help="states")
    s.add_argument("-j", "--jobs", action="append", help="job ids: 123, 123_4, 123_[1-3]")
    s.add_argument("-A", "--account", action="append", help="accounts (comma list)")
    s.add_argument("-n", "--name", action="append", help="job names (comma list)")
    s.add_argument("-a", "--all", action="store_true", help="include finished jobs")
    s.add_argument("--start", action="store_true", help="show estimated start times")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_queue)

    s = sub.add_parser("show", help="show one job (like scontrol show job)")
    s.add_argument("what", choices=["job"])
    s.add_argument("job_id", help="a job id, or ARRAY_TASK (123_4)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_show)

    _register_actions(sub)

    s = sub.add_parser(
        "update",
        help="change pending or running jobs' time limit, nice, name or comment (scontrol update)",
    )
    s.add_argument("job_ids", nargs="+", help="123, 123_4 (array task), 123_[1-3]")
    s.add_argument(
        "-t",
        "--time",
        help="the new time limit: MM, HH:MM:SS, D-HH:MM:SS; +T or -T changes each job's own"
        " (write a decrease as --time=-1:00:00)",
    )
    s.add_argument("--nice", help="the new nice (below 0: operators)")
    s.add_argument("-J", "--name", dest="job_name", help="the new job name")
    s.add_argument("--comment", help="the new comment")
    # what the placer plans a pending job by: checked as a submission is
    s.add_argument("-p", "--partition", help="a pending job's new partition")
    s.add_argument("-q", "--qos", help="a pending job's new QOS")
    s.add_argument("-A", "--account", help="a pending job's new account (one of its owner's)")
    s.add_argument("-N", "--nodes", help="a pending job's new node count: N or MIN-MAX")
    s.add_argument("--gpus-per-node", type=int, help="a pending job's new GPUs per node")
    s.add_argument("-w", "--nodelist", help="nodes a pending job must run on ('' clears)")
    s.add_argument("-x", "--exclude", help="nodes a pending job must not run on ('' clears)")
    s.add_argument("-C", "--constraint", help="features a pending job's nodes need ('' clears)")
    s.add_argument("--begin", help="when a pending job may start: now+1hour, 2026-12-08T10:00")
    s.add_argument("-d", "--dependency", help="a pending job's new dependency ('' clears)")
    s.add_argument(
        "--array-throttle", type=int, help="an array's tasks run at most N at once (0: no limit)"
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_update)

    s = sub.add_parser("reload", help="re-read the cluster configuration (operators)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_reload)


def _register_actions(sub: Any) -> None:
    """cancel, hold, release, requeue and approve: one selection of jobs each."""
    for verb, what in (
        ("cancel", "cancel jobs, or signal running ones with -s (like scancel)"),
        ("hold", "hold pending jobs"),
        ("release", "release held jobs"),
        ("requeue", "stop running jobs and put them back in the queue (like scontrol requeue)"),
        ("approve", "approve jobs of a partition that requires it (operators)"),
    ):
        s = sub.add_parser(verb, help=what)
        s.add_argument("job_ids", nargs="*", help="123, 123_4 (array task), 123_[1-3]")
        s.add_argument("-n", "--name", help="jobs with this name")
        s.add_argument("-u", "--user", dest="owner", help="jobs of this user")
        s.add_argument("-t", "--states", dest="state_filter", action="append")
        s.add_argument("-p", "--partition")
        s.add_argument("--reason")
        s.add_argument("--json", action="store_true")
        if verb == "cancel":
            s.add_argument("-s", "--signal", help="send this signal instead of cancelling")
        if verb == "requeue":
            s.add_argument(
                "--hold",
                action="store_true",
                help="hold them once back in the queue (scontrol requeuehold; release runs them)",
            )
        s.set_defaults(fn=_job_action(verb))
