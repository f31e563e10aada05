"""The `muster` command: a local cluster (`up`, `down`, `demo`) and Slurm-like job
commands (`submit`, `queue`, `show`, `cancel`, `nodes`, ...), `--json` on reads."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from muster import cluster as local
from muster.cli_accounting import register as register_accounting
from muster.client import ApiRefused, agent, call, current_user, nats_url
from shared.api import (
    AgentReply,
    InjectFault,
    JobSelector,
    NodeAction,
    NodesReply,
    Ok,
    QueueReply,
    QueueRequest,
    ReloadReply,
    Request,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)

DEFAULT_TOPOLOGY = Path(__file__).resolve().parent.parent / "deploy" / "local" / "topology.toml"


def _print_json(value: Any) -> None:
    print(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True))


def _hms(seconds: float) -> str:
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


# --- cluster ---------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state)
    if (state / "cluster.json").exists():
        print(f"a cluster is already up in {state}; `muster down` first", file=sys.stderr)
        return 1
    c = local.up(state, Path(args.topology))
    print(f"muster is up: {len(c.nodes)} nodes, services {', '.join(local.SERVICES)}")
    print(f"  state and logs: {c.state_dir} (logs/ has one file per process)")
    print(f"  NATS: {c.nats_url}   PostgreSQL: {c.database_url}")
    return _wait_for_nodes(c, len(c.nodes), args.wait)


def _wait_for_nodes(c: local.Cluster, want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    url = c.nats_url
    while time.monotonic() < deadline:
        try:
            reply = asyncio.run(
                call(url, "nodes", QueueRequest(user=current_user()), NodesReply, 3)
            )
            up = [n for n in reply.nodes if n.state == "UP"]
            if len(up) >= want:
                print(f"  {len(up)} nodes UP, {sum(n.gpus_total for n in up)} GPUs")
                return 0
        except Exception:  # services still starting: no responders yet
            pass
        time.sleep(0.5)
    print("the cluster did not come up in time; see the logs", file=sys.stderr)
    return 1


def cmd_down(args: argparse.Namespace) -> int:
    state = Path(args.state)
    if not (state / "cluster.json").exists():
        print(f"no cluster in {state}", file=sys.stderr)
        return 1
    local.down(state)
    print("muster is down")
    return 0


# --- jobs ------------------------------------------------------------------------------


def cmd_submit(args: argparse.Namespace) -> int:
    words: list[str] = args.words
    options, script_path, script_args = _split_submit(words)
    if script_path is None:
        script_text, path = "", ""
        if not any(w.startswith("--wrap") for w in options):
            print(
                "muster submit: give a script: muster submit [options] SCRIPT [ARGS]",
                file=sys.stderr,
            )
            return 2
    else:
        try:
            raw = Path(script_path).read_bytes()
        except OSError as err:
            print(f"muster submit: cannot read {script_path}: {err.strerror}", file=sys.stderr)
            return 2
        script_text = raw.decode("utf-8", errors="surrogateescape")
        path = str(Path(script_path).resolve())
    req = SubmitRequest(
        user=current_user(),
        argv=tuple(options),
        script=script_text,
        script_path=path,
        args=tuple(script_args),
        workdir=os.getcwd(),
        dry_run=args.dry_run,
    )
    try:
        reply = asyncio.run(call(nats_url(args.state), "submit", req, SubmitReply))
    except ApiRefused as err:
        return _refused("submit", err)
    for warning in reply.warnings:
        print(f"muster submit: warning: {warning}", file=sys.stderr)
    if args.json:
        _print_json(reply)
    elif reply.spec is not None:
        print(json.dumps(reply.spec, indent=2))
    elif len(reply.job_ids) == 1:
        print(f"Submitted batch job {reply.job_ids[0]}")
    else:
        print(f"Submitted array job {reply.job_ids[0]} ({len(reply.job_ids)} tasks)")
    return 0


def _split_submit(words: list[str]) -> tuple[list[str], str | None, list[str]]:
    """Options before the script; the first word that is not an option (nor an option's
    value) is the script. Options taking a separate value are recognised by sbatch's
    short forms; long options use `--opt=value` or `--opt value`."""
    takes_value = set("JNGpAqoetcdaxwCH") - {"H"}
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            return words[:i], (words[i + 1] if i + 1 < len(words) else None), words[i + 2 :]
        if w.startswith("--"):
            if "=" not in w and w[2:] in LONG_WITH_VALUE and i + 1 < len(words):
                i += 2
                continue
            i += 1
            continue
        if w.startswith("-") and len(w) >= 2:
            i += 2 if (len(w) == 2 and w[1] in takes_value) else 1
            continue
        return words[:i], w, words[i + 1 :]
    return words, None, []


LONG_WITH_VALUE = {
    "job-name", "nodes", "gpus-per-node", "gres", "gpus", "ntasks-per-node", "cpus-per-task",
    "mem", "time", "partition", "account", "qos", "output", "error", "signal", "dependency",
    "array", "switches", "constraint", "exclude", "nodelist", "begin", "comment", "export",
    "chdir", "mail-type", "mail-user", "ntasks", "mem-per-cpu", "mem-per-gpu", "reservation",
    "wrap", "licenses", "time-min", "gpus-per-task", "cpus-per-gpu", "nice",
}  # fmt: skip


def _refused(verb: str, err: ApiRefused) -> int:
    print(f"muster {verb}: {err}", file=sys.stderr)
    for detail in err.details:
        if detail != str(err):
            print(f"  {detail}", file=sys.stderr)
    if err.code == "unknown_user":
        print(
            "  (on the local cluster, act as one of deploy/local/cluster.toml's users, "
            "e.g. MUSTER_USER=alice)",
            file=sys.stderr,
        )
    return 1


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
    reply = asyncio.run(call(nats_url(args.state), "queue", req, QueueReply))
    if args.json:
        _print_json(reply)
        return 0
    cols = "{:>7} {:<10} {:<12} {:<8} {:<11} {:>10} {:>5} {:>4}  {}"
    print(
        cols.format(
            "JOBID",
            "PARTITION",
            "NAME",
            "USER",
            "STATE",
            "TIME",
            "NODES",
            "GPUS",
            "REASON/NODELIST" if not args.start else "START_TIME",
        )
    )
    for j in reply.jobs:
        where = (
            ",".join(j.nodelist)
            if j.state in ("RUNNING", "COMPLETING", "STARTING")
            else f"({j.reason})"
        )
        if args.start:
            where = (
                time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(j.estimated_start))
                if j.estimated_start
                else "N/A"
            )
        print(
            cols.format(
                j.job_id,
                j.partition[:10],
                j.name[:12],
                j.user[:8],
                j.state,
                _hms(j.elapsed_s),
                j.nodes,
                j.gpus,
                where,
            )
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    url = nats_url(args.state)
    try:
        job_id = _one_job_id(url, args.job_id)
        reply = asyncio.run(
            call(url, "show", ShowJobRequest(user=current_user(), job_id=job_id), ShowJobReply)
        )
    except ApiRefused as err:
        return _refused("show", err)
    if args.json:
        _print_json(reply)
        return 0
    j = reply.job
    print(f"JobId={j.job_id} JobName={j.name} UserId={j.user} Account={j.account}")
    print(
        f"   JobState={j.state} Reason={j.reason or 'None'} ExitCode={j.exit_code}"
        f" Restarts={j.restart_count}"
    )
    print(
        f"   Partition={j.partition} QOS={j.qos} NumNodes={j.nodes} GPUs={j.gpus}"
        f" TimeLimit={_hms(j.time_limit_s)} RunTime={_hms(j.elapsed_s)}"
    )
    print(f"   NodeList={','.join(j.nodelist) or '(null)'}")
    if j.array_job_id is not None:
        print(f"   ArrayJobId={j.array_job_id} ArrayTaskId={j.array_task_id}")
    if reply.dependency:
        print(f"   Dependency={reply.dependency}")
    if reply.approval:
        print(f"   Approval: {reply.approval}")
    if reply.why_pending:
        print(f"   Why pending: {reply.why_pending}")
    if reply.priority:
        parts = " ".join(f"{k}={v:.0f}" for k, v in sorted(reply.priority.items()) if k != "total")
        print(f"   Priority={reply.priority.get('total', 0):.0f} ({parts})")
    for a in reply.attempts:
        ended = f"{a.ended_at - a.started_at:.1f}s" if a.ended_at else "running"
        print(
            f"   Attempt {a.attempt}.{a.seq}: nodes={','.join(a.nodes)} world_size={a.world_size}"
            f" reason={a.reason} outcome={a.outcome or '-'} ({ended})"
        )
    return 0


def _one_job_id(url: str, ref: str) -> int:
    """`123` or `123_4` (an array task) -> the job id `show` takes."""
    if ref.isdigit():
        return int(ref)
    req = QueueRequest(user=current_user(), job_refs=(ref,), all_states=True)
    jobs = asyncio.run(call(url, "queue", req, QueueReply)).jobs
    if len(jobs) != 1:
        raise ApiRefused(f"{ref} names {len(jobs)} jobs; give one job id", "not_found", ())
    return jobs[0].job_id


def _selector(args: argparse.Namespace) -> JobSelector:
    return JobSelector(
        user=current_user(),
        job_refs=tuple(r for item in args.job_ids for r in item.split(",") if r),
        name=getattr(args, "name", None),
        owner=getattr(args, "owner", None),
        signal=getattr(args, "signal", None),
        reason=getattr(args, "reason", "") or "",
        states=tuple(s.upper() for s in _csv(getattr(args, "state_filter", None))),
        partition=getattr(args, "partition", None),
    )


def _job_action(verb: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            reply = asyncio.run(call(nats_url(args.state), verb, _selector(args), Ok))
        except ApiRefused as err:
            return _refused(verb, err)
        if args.json:
            _print_json(reply)
            return 0
        print(reply.message)
        for why in reply.skipped:
            print(f"  skipped: {why}")
        return 0

    return run


def cmd_reload(args: argparse.Namespace) -> int:
    try:
        reply = asyncio.run(
            call(nats_url(args.state), "reload", Request(user=current_user()), ReloadReply)
        )
    except ApiRefused as err:
        return _refused("reload", err)
    if args.json:
        _print_json(reply)
    else:
        print(f"{reply.message} (partitions: {', '.join(reply.partitions) or 'none'})")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    reply = asyncio.run(
        call(nats_url(args.state), "nodes", QueueRequest(user=current_user()), NodesReply)
    )
    if args.json:
        _print_json(reply)
        return 0
    cols = "{:<10} {:<9} {:>9} {:<14} {:<12} {}"
    print(cols.format("NODE", "STATE", "GPUS", "TOPOLOGY", "UNHEALTHY", "REASON"))
    for n in reply.nodes:
        bad = ",".join(f"{g.index}(xid{g.last_xid})" for g in n.gpus if not g.healthy) or "-"
        print(
            cols.format(
                n.name,
                n.state,
                f"{n.gpus_free}/{n.gpus_total}",
                "/".join(n.topology),
                bad,
                n.reason,
            )
        )
    return 0


def _node_action(verb: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        req = NodeAction(user=current_user(), node=args.node, reason=args.reason or "")
        try:
            reply = asyncio.run(call(nats_url(args.state), verb, req, Ok))
        except ApiRefused as err:
            return _refused(verb, err)
        print(reply.message)
        return 0

    return run


def cmd_inject(args: argparse.Namespace) -> int:
    body = InjectFault(gpu=args.gpu, xid=args.xid, lose_gpu=args.lose)
    raw = asyncio.run(agent(nats_url(args.state), args.node, "inject", body))
    reply = msgspec.json.decode(raw, type=AgentReply)
    print(("injected " if reply.ok else "refused: ") + reply.message)
    return 0 if reply.ok else 1


def cmd_sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(args.rest) or 0)


def cmd_demo(args: argparse.Namespace) -> int:
    from muster.demo import run_demo

    return run_demo(Path(args.state), Path(args.topology))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="muster", description=__doc__)
    p.add_argument(
        "--state",
        default=os.environ.get("MUSTER_STATE_DIR", ".muster"),
        help="state folder of the local cluster",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("up", help="start a local cluster")
    s.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    s.add_argument("--wait", type=float, default=60.0)
    s.set_defaults(fn=cmd_up)
    sub.add_parser("down", help="stop the local cluster").set_defaults(fn=cmd_down)
    s = sub.add_parser("demo", help="up, run a demo workload with a GPU fault, down")
    s.add_argument("--topology", default=str(DEFAULT_TOPOLOGY))
    s.set_defaults(fn=cmd_demo)

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

    for verb, what in (
        ("cancel", "cancel jobs, or signal running ones with -s (like scancel)"),
        ("hold", "hold pending jobs"),
        ("release", "release held jobs"),
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
        s.set_defaults(fn=_job_action(verb))
    s = sub.add_parser("reload", help="re-read the cluster configuration (operators)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_reload)

    s = sub.add_parser("nodes", help="list nodes and GPU health")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_nodes)
    for verb in ("drain", "resume"):
        s = sub.add_parser(verb, help=f"{verb} a node (operators)")
        s.add_argument("node")
        s.add_argument("--reason", required=True)
        s.set_defaults(fn=_node_action(verb))

    s = sub.add_parser("inject-fault", help="inject a GPU XID on a simulated node")
    s.add_argument("node")
    s.add_argument("--gpu", type=int, default=0)
    s.add_argument("--xid", type=int, default=79)
    s.add_argument("--lose", action="store_true", help="the GPU falls off the bus")
    s.set_defaults(fn=cmd_inject)

    s = sub.add_parser("sim", help="replay a trace through the scheduler core", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_sim)
    register_accounting(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "submit" in argv:
        # sbatch's options are the script's business, not argparse's: hand them over whole.
        at = argv.index("submit")
        own = [w for w in argv[at + 1 :] if w in ("--dry-run", "--json")]
        rest = [w for w in argv[at + 1 :] if w not in ("--dry-run", "--json")]
        args = build_parser().parse_args([*argv[:at], "submit", *own])
        args.words = rest
    else:
        args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except ApiRefused as err:
        print(f"muster: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
