"""The `muster` command: a local cluster (`up`, `down`, `demo`) and Slurm-like job
commands (`submit`, `queue`, `show`, `cancel`, `nodes`, ...), `--json` on reads."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import muster.lean_msgspec  # noqa: F401  # before anything imports msgspec (see there)
from muster.client import ApiRefused
from muster.quiet import quietly

# Each subcommand's part of the parser, in `muster --help`'s order: a command line that
# names one builds (and imports) only its part, so `muster queue` loads cli_jobs but not
# what up, down, keys or accounting import. tests/unit/cli/test_hot_path.py holds this
# table to the parser.
PARTS: dict[str, tuple[str, ...]] = {
    "local": ("up", "down", "demo"),
    "jobs": (
        "submit",
        "queue",
        "show",
        "cancel",
        "hold",
        "release",
        "requeue",
        "approve",
        "update",
        "reload",
    ),
    "nodes": ("nodes", "drain", "resume", "inject-fault"),
    "sim": ("sim",),
    "accounting": ("share", "acct", "report"),
    "users": ("keygen", "whoami", "user"),
    "shims": ("shims",),
    "steps": ("srun", "salloc"),
}
PART_OF = {command: part for part, commands in PARTS.items() for command in commands}


def cmd_sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(args.rest) or 0)


def cmd_shims(args: argparse.Namespace) -> int:
    from pathlib import Path

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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (for a `command` of PARTS) one that knows only that
    command's part: the same usage line, options and errors for that command."""
    p = argparse.ArgumentParser(prog="muster", description=__doc__)
    p.add_argument(
        "--state",
        default=os.environ.get("MUSTER_STATE_DIR", ".muster"),
        help="state folder of the local cluster",
    )
    part = PART_OF.get(command or "")
    # the usage line names every command either way (argparse prints it with an error)
    metavar = None if part is None else "{" + ",".join(PART_OF) + "}"
    sub = p.add_subparsers(dest="command", required=True, metavar=metavar)
    for name in PARTS if part is None else (part,):
        _register(name, sub)
    return p


def _register(part: str, sub: Any) -> None:
    """Add one part's subcommands, importing its module only now."""
    if part in ("local", "nodes"):
        from muster import cli_cluster

        (cli_cluster.register_local if part == "local" else cli_cluster.register_nodes)(sub)
    elif part == "jobs":
        from muster import cli_jobs

        cli_jobs.register(sub)
    elif part == "accounting":
        from muster import cli_accounting

        cli_accounting.register(sub)
    elif part == "users":
        from muster import cli_users

        cli_users.register(sub)
    elif part == "sim":
        s = sub.add_parser("sim", help="replay a trace through the scheduler core", add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
        s.set_defaults(fn=cmd_sim)
    elif part == "shims":
        s = sub.add_parser(
            "shims", help="write sbatch, squeue, scancel, ... wrappers into a folder"
        )
        s.add_argument("folder")
        s.add_argument("--force", action="store_true", help="replace files already there")
        s.set_defaults(fn=cmd_shims)
    else:
        for name, what in (
            ("srun", "run a job step on the allocation's nodes, inside a job (docs/steps.md)"),
            ("salloc", "an interactive allocation: a shell (or CMD) with the job's environment"),
        ):
            s = sub.add_parser(name, help=what, add_help=False)
            s.add_argument("words", nargs=argparse.REMAINDER)
            s.set_defaults(fn=cmd_step)


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
    command = None if at is None else argv[at]
    if at is not None and command in ("srun", "salloc"):  # every word after is theirs
        args = build_parser(command).parse_args(argv[: at + 1])
        args.words = argv[at + 1 :]
        return args
    if at is None or command != "submit":
        return build_parser(command).parse_args(argv)
    from shared.sbatch_options import SUBMIT_OWN, split_own

    split = split_own(argv[at + 1 :], SUBMIT_OWN)
    own = {g.name for g in split.own}
    words = [*argv[:at], "submit", *(["-h"] if "help" in own else [])]
    args = build_parser(command).parse_args(words)
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
