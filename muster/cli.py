"""The `muster` command: a local cluster (`up`, `down`, `demo`) and Slurm-like job
commands (`submit`, `queue`, `show`, `cancel`, `nodes`, ...), `--json` on reads."""

from __future__ import annotations

import argparse
import os
import sys

from muster import cli_accounting, cli_cluster, cli_jobs, cli_users
from muster.client import ApiRefused


def cmd_sim(args: argparse.Namespace) -> int:
    from sim.cli import main as sim_main

    return int(sim_main(args.rest) or 0)


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
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed command line; `submit` hands its sbatch options over whole, as they are
    the script's business, not argparse's."""
    if "submit" not in argv:
        return build_parser().parse_args(argv)
    at = argv.index("submit")
    own = [w for w in argv[at + 1 :] if w in cli_jobs.SUBMIT_OWN]
    args = build_parser().parse_args([*argv[:at], "submit", *own])
    args.words = [w for w in argv[at + 1 :] if w not in cli_jobs.SUBMIT_OWN]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(list(sys.argv[1:] if argv is None else argv))
    try:
        return int(args.fn(args))
    except ApiRefused as err:
        print(f"muster: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
