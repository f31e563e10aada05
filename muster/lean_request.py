"""Pure (but for reading the script and the environment): the requests of the lean
commands (muster.lean) as plain JSON fields — the words read by hand, the submit
request's fields — which the full commands (muster.cli_jobs, muster.shims) build their
structs from too, and the attribute views of a reply the formatters print. Apart from
muster.lean so the full commands import these without the lean entry points."""

from __future__ import annotations

import os
import sys

from muster import client_env

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# `muster submit`'s own options before the script, and sbatch's shim's (muster.cli and
# muster.shims split with the same ones)

# The list options `muster queue` and `squeue` share: word -> the request field it adds
# to (comma lists, repeatable), as their argparse parsers name them
LIST_OPTIONS = {
    "-u": "users",
    "--user": "users",
    "-p": "partitions",
    "--partition": "partitions",
    "-j": "job_refs",
    "--jobs": "job_refs",
    "-A": "accounts",
    "--account": "accounts",
    "-n": "names",
    "--name": "names",
}
QUEUE_OPTIONS = {**LIST_OPTIONS, "-t": "states", "--states": "states"}
QUEUE_FLAGS = {"-a": "all", "--all": "all", "--start": "start"}
SQUEUE_OPTIONS = {**QUEUE_OPTIONS, "-o": "format", "--format": "format"}
SQUEUE_FLAGS = {
    "-h": "noheader", "--noheader": "noheader", "--me": "me", "-a": "every",
    "-r": "array", "--array": "array",
}  # fmt: skip
SINGLE = ("format",)  # the last one given counts, as argparse's store


class View:
    """A reply object's JSON fields as attributes, as its msgspec struct has them
    (nested objects viewed too, lists as tuples): what the formatters read."""

    def __init__(self, fields: dict[str, Any]) -> None:
        for name, value in fields.items():
            setattr(self, name, _viewed(value))


def _viewed(value: Any) -> Any:
    if isinstance(value, dict):
        return View(value)
    if isinstance(value, list):
        return tuple(_viewed(v) for v in value)
    return value


# --- the words ------------------------------------------------------------------------


def options(
    words: Sequence[str], valued: dict[str, str], flags: dict[str, str]
) -> dict[str, Any] | None:
    """`words` read as argparse reads these options (`-u a`, `-ua`, `--user a`,
    `--user=a`, repeatable); None for anything else (the full command reads those)."""
    got: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if not eq and len(word) > 2 and word[0] == "-" and word[1] != "-":
            name, value, eq = word[:2], word[2:], "attached"  # -ualice, as argparse takes it
        if name in flags and not eq:
            got[flags[name]] = True
        elif name in valued:
            if not eq:
                if i + 1 >= len(words) or words[i + 1].startswith("-"):
                    return None  # the full parser says what is missing
                i += 1
                value = words[i]
            field = valued[name]
            if field in SINGLE:
                got[field] = value
            else:
                got.setdefault(field, []).append(value)
        else:
            return None
        i += 1
    return got


def csv(values: Sequence[str] | None) -> tuple[str, ...]:
    """`-u a,b -u c` -> (a, b, c), as squeue takes lists."""
    return tuple(v for item in values or () for v in item.split(",") if v)


def submit_fields(words: Sequence[str], dry_run: bool) -> dict[str, Any] | str:
    """The submit request's fields (shared.api.SubmitRequest's) from the command line
    and the script file, or what is wrong; the full commands build their struct from
    these too."""
    from shared.sbatch_options import split_command_line

    # The script is found the way admission reads the options: one table of sbatch's.
    line = split_command_line(words)
    script_text, path = "", ""
    wrapped = any(w.startswith("--wrap") for w in line.options)  # the script is made
    if line.script is None and not wrapped:
        if sys.stdin is None or sys.stdin.isatty():
            return "give a script: muster submit [options] SCRIPT [ARGS] (or pipe it in)"
        # as sbatch: a script piped in or written in a here-document
        script_text = sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape")
        if not script_text.strip():
            return "the script read from standard input is empty: give a script"
    elif line.script is not None:
        try:
            with open(line.script, "rb") as f:  # not pathlib: a shim runs without site's
                raw = f.read()
        except OSError as err:
            return f"cannot read {line.script}: {err.strerror}"
        script_text = raw.decode("utf-8", errors="surrogateescape")
        path = os.path.realpath(line.script)  # what Path.resolve() says
    return {
        "user": client_env.current_user(),
        "argv": line.options,
        "script": script_text,
        "script_path": path,
        "args": line.args,
        "workdir": os.getcwd(),
        "dry_run": dry_run,
        "environment": dict(os.environ),  # sbatch's: --export passes (a part of) it on
    }


def queue_fields(got: dict[str, Any], states: tuple[str, ...], all_states: bool) -> dict[str, Any]:
    """shared.api.QueueRequest's fields from `options`' answer."""
    return {
        "user": client_env.current_user(),
        "users": csv(got.get("users")),
        "partitions": csv(got.get("partitions")),
        "states": states,
        "all_states": all_states,
        "job_refs": csv(got.get("job_refs")),
        "accounts": csv(got.get("accounts")),
        "names": csv(got.get("names")),
    }
