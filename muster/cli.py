"""The `muster` command: a local cluster (`up`, `down`, `demo`) and Slurm-like job
commands (`submit`, `queue`, `show`, `cancel`, `nodes`, ...), `--json` on reads."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from muster import cli_accounting, cli_cluster, cli_jobs, cli_users
from muster.client import ApiRefused
from muster.quiet import quietly
from shared.sbatch_options import Arg, Spec, split_own


def cmd_sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(args.rest) or 0)


def cmd_shims(args: argparse.Namespace) -> int:
    from muster.shims import ShimError, write_shims

    try:
        names = write_shims(Path(args.folder), force=args.force)
    except ShimError as err:
        print(f"muster shims: {err}", file=sys.stderr)
        return 1
    print(f"wrote {' '.join(names)} into {args.folder}; put it first on PATH to use them")
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    """`muster srun` / `muster salloc`: their own option tables (muster/steps.py, salloc.py)."""
    if args.command == "srun":
        from muster import steps

        return steps.main(args.words)
    from muster import salloc

    return salloc.main(args.words)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="muster", description=__doc__)
    p.add_argument(
        "--state",
        default=os.environ.get("MUSTER_STATE_DIR", ".muster"),
        help="state folder of the local cluster",
    )
    sub = p.add_subparsers(dest="command", required=True)
    cli_cluster.register_local(sub)
    cli_jobs.register(sub)
    cli_cluster.register_nodes(sub)
    s = sub.add_parser("sim", help="replay a trace through the scheduler core", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_sim)
    cli_accounting.register(sub)
    cli_users.register(sub)
    s = sub.add_parser("shims", help="write sbatch, squeue, scancel, ... wrappers into a folder")
    s.add_argument("folder")
    s.add_argument("--force", action="store_true", help="replace files already there")
    s.set_defaults(fn=cmd_shims)
    for name, what in (
        ("srun", "run a job step on the allocation's nodes, inside a job (docs/steps.md)"),
        ("salloc", "an interactive allocation: a shell (or CMD) with the job's environment"),
    ):
        s = sub.add_parser(name, help=what, add_help=False)
        s.add_argument("words", nargs=argparse.REMAINDER)
        s.set_defaults(fn=cmd_step)
    return p


# The options `muster submit` keeps for itself when they come before the script;
# every other word is sbatch's (the shared table) or the script's own.
SUBMIT_OWN = (
    Spec("json", None, Arg.NONE),
    Spec("dry-run", None, Arg.NONE),
    Spec("help", None, Arg.NONE),
)


def _command_at(argv: list[str]) -> int | None:
    """Where the subcommand is: the first word that is not a global option (`--state X`,
    `--state=X`, `-h`), so a job or script named `submit` is never taken for it."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--state":
            i += 2
        elif word.startswith("--state=") or word in ("-h", "--help"):
            i += 1
        else:
            return None if word.startswith("-") else i
    return None


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; `submit` hands its sbatch options over whole, as they are
    the script's business, not argparse's."""
    at = _command_at(argv)
    if at is not None and argv[at] in ("srun", "salloc"):  # every word after is theirs
        args = build_parser().parse_args([*argv[:at], argv[at]])
        args.words = argv[at + 1 :]
        return args
    if at is None or argv[at] != "submit":
        return build_parser().parse_args(argv)
    split = split_own(argv[at + 1 :], SUBMIT_OWN)
    own = {g.name for g in split.own}
    args = build_parser().parse_args([*argv[:at], "submit", *(["-h"] if "help" in own else [])])
    args.json = "json" in own
    args.dry_run = "dry-run" in own
    line = split.line
    script = [] if line.script is None else ["--", line.script, *line.args]
    args.words = [*line.options, *script]
    return args


def main(argv: list[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        args = parse(words)
        try:
            return int(args.fn(args))
        except ApiRefused as err:  # unreachable, no service, a refusal: one line
            print(f"muster: {err}", file=sys.stderr)
            return 1

    return quietly(run)


if __name__ == "__main__":
    sys.exit(main())
