"""`muster submit`'s words, split the way sbatch splits them: muster's own flags (only
before the script), sbatch's options with their values (attached or separate, from the
one shared table), the script path, and the script's own arguments untouched."""

from __future__ import annotations

import pytest

from muster.cli import parse
from shared.sbatch_options import split_command_line

# name -> (argv after `muster`, want options, want script, want args, want json, want dry_run)
CASES: dict[str, tuple[list[str], list[str], str | None, list[str], bool, bool]] = {
    "a bare script": (["submit", "job.sh"], [], "job.sh", [], False, False),
    "-n takes its value as the next word": (
        ["submit", "-n", "4", "job.sh"],
        ["-n", "4"],
        "job.sh",
        [],
        False,
        False,
    ),
    "-n takes its value attached": (
        ["submit", "-n4", "job.sh"],
        ["-n4"],
        "job.sh",
        [],
        False,
        False,
    ),
    "-b, -D and --ntasks-per-gpu take values": (
        ["submit", "-b", "now+1hour", "-D", "/scratch", "--ntasks-per-gpu", "2", "job.sh"],
        ["-b", "now+1hour", "-D", "/scratch", "--ntasks-per-gpu", "2"],
        "job.sh",
        [],
        False,
        False,
    ),
    "a long option with = keeps one word": (
        ["submit", "--gres=gpu:h100:4", "job.sh", "x"],
        ["--gres=gpu:h100:4"],
        "job.sh",
        ["x"],
        False,
        False,
    ),
    "an abbreviated long option takes its value": (
        ["submit", "--part", "debug", "job.sh"],
        ["--part", "debug"],
        "job.sh",
        [],
        False,
        False,
    ),
    "grouped flags then a value-taking short option": (
        ["submit", "-HN", "2", "job.sh"],
        ["-HN", "2"],
        "job.sh",
        [],
        False,
        False,
    ),
    "muster's flags before sbatch's options": (
        ["submit", "--json", "--dry-run", "-N", "2", "job.sh"],
        ["-N", "2"],
        "job.sh",
        [],
        True,
        True,
    ),
    "muster's flags among sbatch's options": (
        ["submit", "-p", "debug", "--json", "-G", "h100:2", "--dry-run", "job.sh"],
        ["-p", "debug", "-G", "h100:2"],
        "job.sh",
        [],
        True,
        True,
    ),
    "the script's --json and --dry-run are its own": (
        ["submit", "train.py", "--json", "--dry-run", "-n", "4"],
        [],
        "train.py",
        ["--json", "--dry-run", "-n", "4"],
        False,
        False,
    ),
    "a value that looks like an option is a value": (
        ["submit", "-J", "--json", "job.sh"],
        ["-J", "--json"],
        "job.sh",
        [],
        False,
        False,
    ),
    "-- ends the options, so a script may start with a dash": (
        ["submit", "-N", "1", "--", "-odd.sh", "--json"],
        ["-N", "1"],
        "-odd.sh",
        ["--json"],
        False,
        False,
    ),
    "--wrap needs no script": (
        ["submit", "--wrap", "hostname", "--json"],
        ["--wrap", "hostname"],
        None,
        [],
        True,
        False,
    ),
    "a global --state before submit": (
        ["--state", "/tmp/s", "submit", "-n", "4", "job.sh", "a"],
        ["-n", "4"],
        "job.sh",
        ["a"],
        False,
        False,
    ),
    "a script named submit is a script": (
        ["submit", "submit", "submit"],
        [],
        "submit",
        ["submit"],
        False,
        False,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_submit_words_split_like_sbatch(name: str) -> None:
    argv, options, script, args, json, dry_run = CASES[name]
    parsed = parse(argv)
    line = split_command_line(parsed.words)
    assert (list(line.options), line.script, list(line.args)) == (options, script, args)
    assert (parsed.json, parsed.dry_run) == (json, dry_run)


def test_other_commands_are_not_taken_for_submit() -> None:
    parsed = parse(["queue", "-n", "submit"])
    assert parsed.command == "queue"
    assert parsed.name == ["submit"]


def test_own_options_are_taken_out_long_and_short_before_the_script_only() -> None:
    from shared.sbatch_options import SBATCH_OWN, split_own

    split = split_own(["-W", "-N2", "--parsable", "-t", "5", "job.sh", "-W"], SBATCH_OWN)
    assert [(g.name, g.value) for g in split.own] == [("wait", None), ("parsable", None)]
    assert (split.line.options, split.line.script, split.line.args) == (
        ("-N2", "-t", "5"),
        "job.sh",
        ("-W",),
    )
