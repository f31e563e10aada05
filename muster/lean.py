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
from muster.lean_request import (
    QUEUE_FLAGS,
    QUEUE_OPTIONS,
    SQUEUE_FLAGS,
    SQUEUE_OPTIONS,
    View,
    csv,
    options,
    queue_fields,
    submit_fields,
)
from muster.refusal import ApiRefused, print_refusal
from shared.lean_json import dumps, loads

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

TIMEOUT_S = 15.0

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
        details = tuple(error.get("details", ()))
        raise ApiRefused(str(error.get("error", "refused")), error.get("code", "invalid"), details)
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
        from shared.sbatch_options import SUBMIT_OWN, split_own  # not for a queue

        split = split_own(words[1:], SUBMIT_OWN)
        if split.own:
            return None  # --json, --dry-run, --help
        script = [] if split.line.script is None else ["--", split.line.script]
        return _submit([*split.line.options, *script, *split.line.args])
    if words[0] == "queue":
        got = options(words[1:], QUEUE_OPTIONS, QUEUE_FLAGS)
        return None if got is None else _queue(got)
    return None


def _submitted(
    words: list[str],
    who: str,
    bad: Callable[[str], int],
    refused: Callable[[ApiRefused], int],
    *,
    first_node: bool = False,
) -> list[int] | int:
    """The job ids of the submission `words` make, its warnings printed as `who`'s; or
    the exit status `bad` (the words or the script) or `refused` (the API) returned.
    `first_node`: a plain script runs on the first node only (sbatch's, as Slurm's)."""
    fields = submit_fields(words, dry_run=False)
    if isinstance(fields, str):
        return bad(fields)
    fields["batch_first_node"] = first_node
    try:
        reply = call(_url(), "submit", fields)
    except ApiRefused as err:
        return refused(err)
    for warning in reply.get("warnings", ()):
        print(f"{who}: warning: {warning}", file=sys.stderr)
    if reply.get("spec") is not None:  # --test-only: checked, not stored
        return _checked(who, reply["spec"])
    ids: list[int] = reply["job_ids"]
    return ids


def _checked(who: str, spec: dict[str, Any]) -> int:
    """A dry run's answer: sbatch's line, as Slurm's goes to stderr; muster submit's,
    the spec as JSON (as the full `muster submit --dry-run` prints it)."""
    if who == "sbatch":
        from muster.slurm_format import checked_line

        print(checked_line(spec), file=sys.stderr)
        return 0
    import json

    print(json.dumps(spec, indent=2))
    return 0


def _submit(words: list[str]) -> int:
    def bad(why: str) -> int:
        print(f"muster submit: {why}", file=sys.stderr)
        return 2

    def refused(err: ApiRefused) -> int:
        print_refusal("muster submit", str(err), err.code, err.details)
        return 1

    ids = _submitted(words, "muster submit", bad, refused)
    if isinstance(ids, int):
        return ids
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
        from shared.sbatch_options import SBATCH_OWN, split_own  # not for a squeue

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
    def error(why: object) -> int:  # as Slurm's commands say it: one line, status 1
        print(f"sbatch: error: {why}", file=sys.stderr)
        return 1

    ids = _submitted(words, "sbatch", error, error, first_node=True)
    if isinstance(ids, int):
        return ids
    print(ids[0] if parsable else f"Submitted batch job {ids[0]}", flush=True)
    return 0


def _squeue(got: dict[str, Any]) -> int:
    from muster import slurm_format as fmt

    states, all_states = fmt.state_filter(csv(got.get("states")))
    fields = queue_fields(got, states, all_states)
    fields["mine"] = bool(got.get("me"))  # the server knows who signed
    fields["dependencies"] = fmt.asks_dependency(got.get("format"), None)
    try:
        jobs = View(call(_url(), "queue", fields)).jobs  # type: ignore[attr-defined]
        lines = fmt.squeue_lines(
            jobs, got.get("format"), None, not got.get("noheader"), bool(got.get("array"))
        )
    except (ApiRefused, fmt.FormatError) as err:
        print(f"squeue: error: {err}", file=sys.stderr)
        return 1
    if lines:  # -h and no job: nothing at all, as Slurm's (not an empty line)
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
