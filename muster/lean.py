"""Shell: the commands a sweep's loop or a monitoring poll runs, on a lean path —
`muster submit`, `muster queue`, `sbatch [--parsable]` and `squeue` in their common forms.

A one-shot command's cost is its imports: argparse, msgspec (with typing, datetime,
decimal, uuid), enum and re each cost a call here more than its own work. These forms
parse their words by hand, build the request as plain JSON (shared.lean_json), sign it
with the key pair alone (shared.identity_sodium) and print with the same pure formatters
as the full commands (muster.render, muster.slurm_format), over views of the reply's
JSON. tests/unit/cli/test_lean.py holds each request equal to the full command's and
tests/unit/cli/test_hot_path.py the imports out.

Any other form — an option not listed here, `--json`, `--help`, `--wait`, a word
these parsers do not read — is not refused here: `run` returns None before anything is
sent, and the caller runs the full command (argparse, msgspec) with the same words.
"""

from __future__ import annotations

import os
import sys
import time

from muster import client_env
from muster.exchange import API_PREFIX, exchange
from muster.refusal import ApiRefused, print_refusal
from shared.lean_json import dumps, loads
from shared.sbatch_options import Arg, Spec, split_own

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

# `muster submit`'s own options before the script, and sbatch's shim's (muster.cli and
# muster.shims split with the same ones)
SUBMIT_OWN_HELP = tuple(Spec(n, None, Arg.NONE) for n in ("json", "dry-run", "help"))
SBATCH_OWN = (Spec("parsable", None, Arg.NONE), Spec("wait", "W", Arg.NONE))
TIMEOUT_S = 15.0

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
SQUEUE_FLAGS = {"-h": "noheader", "--noheader": "noheader", "--me": "me", "-a": "every"}
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
    if line.script is None:
        if not any(w.startswith("--wrap") for w in line.options):
            return "give a script: muster submit [options] SCRIPT [ARGS]"
    else:
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


# --- the request ----------------------------------------------------------------------


def call(url: str, verb: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The `ok` result of the signed request; ApiRefused for a refusal or no way there."""
    from shared.identity_key import KEYGEN_HINT, KeyFileError, load_pair
    from shared.identity_sodium import sign_request

    try:
        pair = load_pair(client_env.key_path(str(fields.get("user", ""))))
    except KeyFileError as err:
        raise ApiRefused(f"no usable key: {err}; {KEYGEN_HINT}", "no_key", ()) from err
    body = dumps(fields).encode()
    subject = API_PREFIX + verb

    def payload() -> bytes:
        return sign_request(pair, subject, body, now=time.time(), nonce=os.urandom(16))

    reply = loads(exchange(url, verb, payload, TIMEOUT_S))
    if reply.get("error") is not None:
        error = reply["error"]
        raise ApiRefused(error["error"], error.get("code", "invalid"), tuple(error["details"]))
    ok: dict[str, Any] = reply["ok"]
    return ok


def _url() -> str:
    return client_env.nats_url(os.environ.get("MUSTER_STATE_DIR"))


# --- the commands ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`muster`'s entry point: the lean form of the command if it has one, else the
    full command (muster.cli) with the same words."""
    words = _words(argv)
    return _either(lambda: muster(words), lambda: _full_cli(words))


def shim_main(argv: list[str] | None = None) -> int:
    """A shim's entry point (muster/shim_script.py): NAME ARGS, lean or full."""
    words = _words(argv)
    name, rest = (words[0], words[1:]) if words else ("", [])
    return _either(lambda: shim(name, rest), lambda: _full_shim(words))


def _words(argv: list[str] | None) -> list[str]:
    return list(sys.argv[1:] if argv is None else argv)


def _either(lean: Callable[[], int | None], full: Callable[[], int]) -> int:
    """The lean command's exit status (a closed pipe or Ctrl-C ending it quietly, as
    muster.quiet ends the full ones), or the full command's where it has no lean form."""
    from muster.quiet import quietly

    status: int | None = None

    def run() -> int:
        nonlocal status
        status = lean()
        return status or 0

    code = quietly(run)
    return full() if status is None and code == 0 else code


def _full_cli(words: list[str]) -> int:
    from muster.cli import main as full

    return full(words)


def _full_shim(words: list[str]) -> int:
    import muster.lean_msgspec  # noqa: F401  # before anything imports msgspec (see there)
    from muster.shims import main as full

    return full(words)


def muster(words: list[str]) -> int | None:
    """`muster submit ...` and `muster queue ...` in their lean forms, else None."""
    if not words or words[0].startswith("-") or "MUSTER_NO_LEAN" in os.environ:
        return None  # global options (--state): the full parser
    if words[0] == "submit":
        split = split_own(words[1:], SUBMIT_OWN_HELP)
        if split.own:
            return None  # --json, --dry-run, --help
        script = [] if split.line.script is None else ["--", split.line.script]
        return _submit([*split.line.options, *script, *split.line.args])
    if words[0] == "queue":
        got = options(words[1:], QUEUE_OPTIONS, QUEUE_FLAGS)
        return None if got is None else _queue(got)
    return None


def _submit(words: list[str]) -> int:
    fields = submit_fields(words, dry_run=False)
    if isinstance(fields, str):
        print(f"muster submit: {fields}", file=sys.stderr)
        return 2
    try:
        reply = call(_url(), "submit", fields)
    except ApiRefused as err:
        print_refusal("muster submit", str(err), err.code, err.details)
        return 1
    for warning in reply.get("warnings", ()):
        print(f"muster submit: warning: {warning}", file=sys.stderr)
    ids = reply["job_ids"]
    if len(ids) == 1:
        print(f"Submitted batch job {ids[0]}")
    else:
        print(f"Submitted array job {ids[0]} ({len(ids)} tasks)")
    return 0


def _queue(got: dict[str, Any]) -> int:
    from muster.render import queue_lines

    states = tuple(s.upper() for s in csv(got.get("states")))
    try:
        reply = View(call(_url(), "queue", queue_fields(got, states, bool(got.get("all")))))
    except ApiRefused as err:  # as muster.cli says it: one line
        print(f"muster: {err}", file=sys.stderr)
        return 1
    print("\n".join(queue_lines(reply, start=bool(got.get("start")))))  # type: ignore[arg-type]
    return 0


def shim(name: str, words: list[str]) -> int | None:
    """`sbatch` and `squeue` in their lean forms, else None."""
    if "MUSTER_NO_LEAN" in os.environ:
        return None
    if name == "sbatch":
        split = split_own(words, SBATCH_OWN)
        own = {g.name for g in split.own}
        if "wait" in own or "-W" in split.line.options:
            return None
        script = [] if split.line.script is None else ["--", split.line.script]
        return _sbatch([*split.line.options, *script, *split.line.args], "parsable" in own)
    if name == "squeue":
        got = options(words, SQUEUE_OPTIONS, SQUEUE_FLAGS)
        return None if got is None else _squeue(got)
    return None


def _sbatch(words: list[str], parsable: bool) -> int:
    fields = submit_fields(words, dry_run=False)
    if isinstance(fields, str):
        print(f"sbatch: error: {fields}", file=sys.stderr)
        return 1
    try:
        reply = call(_url(), "submit", fields)
    except ApiRefused as err:
        print(f"sbatch: error: {err}", file=sys.stderr)
        return 1
    for warning in reply.get("warnings", ()):
        print(f"sbatch: warning: {warning}", file=sys.stderr)
    first = reply["job_ids"][0]
    print(first if parsable else f"Submitted batch job {first}", flush=True)
    return 0


def _squeue(got: dict[str, Any]) -> int:
    from muster import slurm_format as fmt

    states, all_states = fmt.state_filter(csv(got.get("states")))
    fields = queue_fields(got, states, all_states)
    if got.get("me"):
        fields["users"] += (client_env.current_user() or os.environ.get("USER", ""),)
    try:
        jobs = View(call(_url(), "queue", fields)).jobs  # type: ignore[attr-defined]
        lines = fmt.squeue_lines(jobs, got.get("format"), None, header=not got.get("noheader"))
    except (ApiRefused, fmt.FormatError) as err:
        print(f"squeue: error: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
