"""Pure: the command line of a node-side launch shell (raynode, containerrun): its own
options, then `--`, then the job's command, which is never parsed as options."""

from __future__ import annotations

import argparse


def parse_wrapped(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser`'s options before `--`; the command after it as `.command`."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.command = argv[cut + 1 :]
    if not args.command:
        parser.error("the job's command follows --")
    return args
