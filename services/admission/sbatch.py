"""Pure: `muster submit [options] SCRIPT [ARGS]` -> a `JobSpec`, as sbatch would read it.

Options come from three places, applied in this order so that later ones win:
`#SBATCH` directives, then `#MUSTER` directives, then the command line. Directives
are read only in the script's header, before its first command, like sbatch: blank
lines and comments may sit among them, a `#` after a directive starts a comment, and
values are never expanded (`$HOME` stays `$HOME`). Nothing here raises: every problem
comes back in `Parsed.errors`, every tolerated oddity in `Parsed.warnings`.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

import msgspec

from shared.jobspec import JobSpec
from shared.outputs import expand_pattern
from shared.sbatch_options import CommandLine, Given, Problem, split_command_line, tokenize

from .apply import HANDLERS, Builder, finish
from .errors import ErrorCode, SubmitError

MAX_SCRIPT_BYTES = 4 * 1024 * 1024
DIRECTIVE_PREFIXES = ("#SBATCH", "#MUSTER")

_PROBLEM_CODES = {
    "unknown": ErrorCode.UNKNOWN_OPTION,
    "ambiguous": ErrorCode.AMBIGUOUS_OPTION,
    "missing": ErrorCode.MISSING_VALUE,
    "unexpected": ErrorCode.UNEXPECTED_VALUE,
}


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of parsing one submission. `spec` is None whenever `errors` is not empty.

    `explicit` names the JobSpec fields the submitter set, so admission fills the rest
    (time limit, account, QOS, partition) from the configuration.
    """

    spec: JobSpec | None
    warnings: tuple[str, ...] = ()
    errors: tuple[SubmitError, ...] = ()
    explicit: frozenset[str] = frozenset()
    dry_run: bool = False


def _error(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


def decode_script(script: str | bytes) -> tuple[str, list[str], list[SubmitError]]:
    """Check size and content, normalise line endings; returns (text, warnings, errors)."""
    raw = script.encode("utf-8", "surrogatepass") if isinstance(script, str) else script
    if len(raw) > MAX_SCRIPT_BYTES:
        msg = (
            f"the script is {len(raw)} bytes; the limit is {MAX_SCRIPT_BYTES} bytes (4 MiB). "
            "Keep data out of the script and read it from a file instead"
        )
        return "", [], [_error(ErrorCode.SCRIPT_TOO_LARGE, msg, "script")]
    binary = _error(
        ErrorCode.SCRIPT_BINARY,
        "the script is not text (it holds NUL bytes or is not UTF-8); submit a shell script",
        "script",
    )
    if b"\0" in raw:
        return "", [], [binary]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "", [], [binary]
    if not text.strip():
        msg = "the script is empty; it needs at least a '#!' line and a command"
        return "", [], [_error(ErrorCode.SCRIPT_EMPTY, msg, "script")]
    warnings = []
    if text.startswith("\ufeff"):
        text = text[1:]
        warnings.append("the script started with a UTF-8 byte order mark; removed it")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
        warnings.append("the script had DOS line endings (\\r\\n); converted to \\n")
    if not text.startswith("#!"):
        msg = (
            "the script does not start with '#!': the first line must name an interpreter, "
            "e.g. #!/bin/bash"
        )
        return text, warnings, [_error(ErrorCode.SCRIPT_NO_SHEBANG, msg, "script")]
    return text, warnings, []


class Directive(msgspec.Struct, frozen=True):
    line: int
    prefix: str
    words: tuple[str, ...]


def read_header(text: str) -> tuple[list[Directive], list[str], list[SubmitError]]:
    """The directives before the first command; later ones are ignored with a warning."""
    directives: list[Directive] = []
    warnings: list[str] = []
    errors: list[SubmitError] = []
    in_header = True
    for number, line in enumerate(text.split("\n"), start=1):
        prefix = next((p for p in DIRECTIVE_PREFIXES if _is_directive(line, p)), None)
        if not in_header:
            if prefix:
                warnings.append(
                    f"line {number}: {prefix} after the first command is ignored "
                    "(directives must come before any command, as in sbatch)"
                )
            continue
        stripped = line.strip()
        if prefix is None:
            if stripped and not stripped.startswith("#"):
                in_header = False
            continue
        try:
            words = shlex.split(_strip_comment(line[len(prefix) :]))
        except ValueError as err:
            msg = f"line {number}: cannot read {line.strip()!r}: {err}; check the quotes"
            errors.append(_error(ErrorCode.BAD_DIRECTIVE, msg, "script"))
            continue
        directives.append(Directive(number, prefix, tuple(words)))
    return directives, warnings, errors


def _strip_comment(text: str) -> str:
    """Cut at a `#` that starts a word outside quotes, as a shell would: `-o out#1` keeps
    its `#`, `-N 2  # two nodes` loses the comment."""
    quote = ""
    previous = " "
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"" and previous != "\\":
            quote = ch
        elif ch == "#" and previous.isspace():
            return text[:i]
        previous = ch
    return text


def _is_directive(line: str, prefix: str) -> bool:
    return line.startswith(prefix) and (len(line) == len(prefix) or line[len(prefix)].isspace())


def _problem_error(problem: Problem, where: str) -> SubmitError:
    return _error(_PROBLEM_CODES[problem.kind], where + problem.message, problem.name)


class _Source(msgspec.Struct, frozen=True):
    where: str  # "" for the command line, "line N: " for a directive
    given: tuple[Given, ...]
    from_script: bool


def _sources(
    directives: list[Directive], argv: Sequence[str]
) -> tuple[list[_Source], list[SubmitError]]:
    ordered = sorted(directives, key=lambda d: DIRECTIVE_PREFIXES.index(d.prefix))
    sources: list[_Source] = []
    errors: list[SubmitError] = []
    for d in ordered:
        where = f"line {d.line} ({d.prefix}): "
        tokens = tokenize(d.words, stop_at_positional=False)
        errors.extend(_problem_error(p, where) for p in tokens.problems)
        if tokens.positional:
            stray = " ".join(tokens.positional)
            msg = f"{where}unexpected word(s) {stray!r}; a directive holds options only"
            errors.append(_error(ErrorCode.BAD_DIRECTIVE, msg, "script"))
        sources.append(_Source(where, tokens.given, True))
    tokens = tokenize(argv, stop_at_positional=False)
    errors.extend(_problem_error(p, "") for p in tokens.problems)
    if tokens.positional:
        stray = " ".join(tokens.positional)
        msg = f"unexpected argument(s) {stray!r} among the options; options go before SCRIPT"
        errors.append(_error(ErrorCode.BAD_VALUE, msg, "argv"))
    sources.append(_Source("", tokens.given, False))
    return sources, errors


def _apply(builder: Builder, sources: list[_Source]) -> list[SubmitError]:
    errors: list[SubmitError] = []
    unsupported: dict[str, None] = {}
    for source in sources:
        for given in source.given:
            handler = HANDLERS.get(given.name)
            if handler is None:
                unsupported.setdefault(f"--{given.name}", None)
                continue
            if given.name == "dry-run" and source.from_script:
                builder.warnings.append("--dry-run in a script is ignored; give it to the CLI")
                continue
            try:
                handler(builder, given.value)
            except ValueError as err:
                errors.append(_error(ErrorCode.BAD_VALUE, f"{source.where}{err}", given.name))
    if unsupported:
        names = ", ".join(unsupported)
        builder.warnings.append(f"sbatch option(s) not supported by Muster, ignored: {names}")
    return errors


def _expansion_warnings(directives: list[Directive]) -> list[str]:
    return [
        f"line {d.line}: '$' in a directive is not expanded (as in sbatch): {' '.join(d.words)!r}"
        for d in directives
        if any("$" in w for w in d.words)
    ]


def parse_submission(
    argv: Sequence[str],
    script_text: str | bytes,
    *,
    user: str,
    workdir: str,
    script_path: str = "",
    args: Sequence[str] = (),
    now: float | None = None,
    batch_first_node: bool = False,
) -> Parsed:
    """Parse options (`argv`, the words before SCRIPT) and the script's directives.

    `now` (epoch seconds) is needed only for `--begin`. `batch_first_node` is where a
    plain script runs when neither says `--batch-nodes` (the sbatch shim asks for the
    first node, as Slurm runs it; `muster submit` for every node). With `--wrap=CMD` in
    argv the script text may be empty: the job runs `CMD` under /bin/sh, as with sbatch.
    """
    wrapped = _wrapped_command(argv)
    if wrapped is not None:
        script_text = f"#!/bin/sh\n{wrapped}\n"
    text, warnings, errors = decode_script(script_text)
    if errors:
        return Parsed(spec=None, warnings=tuple(warnings), errors=tuple(errors))
    directives, header_warnings, errors = read_header(text)
    warnings += header_warnings + _expansion_warnings(directives)
    sources, source_errors = _sources(directives, argv)
    name = "wrap" if wrapped is not None else posixpath.basename(script_path) or "sbatch"
    builder = _builder(name, user, text, args, workdir, now)
    builder.fields["batch_first_node"] = batch_first_node
    if script_path:
        builder.fields["script_name"] = posixpath.basename(script_path)
    errors += source_errors + _apply(builder, sources)
    if not errors:
        errors += finish(builder)
    warnings += builder.warnings
    if errors:
        return Parsed(spec=None, warnings=tuple(warnings), errors=tuple(errors))
    try:
        # convert, not JobSpec(...): it enforces the contract's Annotated limits too.
        spec = msgspec.convert(builder.fields, JobSpec)
    except msgspec.ValidationError as err:
        bad = _error(ErrorCode.BAD_VALUE, f"the job does not fit the job contract: {err}", "")
        return Parsed(spec=None, warnings=tuple(warnings), errors=(bad,))
    return Parsed(
        spec=spec,
        warnings=tuple(warnings),
        explicit=frozenset(builder.explicit),
        dry_run=builder.dry_run,
    )


def _builder(
    name: str, user: str, text: str, args: Sequence[str], workdir: str, now: float | None
) -> Builder:
    fields: dict[str, object] = {
        "name": name,
        "user": user,
        "script": text,
        "args": tuple(args),
        "workdir": workdir,
        "nodes_min": 1,
        "nodes_max": 1,
        "gpus_per_node": 0,
        "ntasks_per_node": 1,
        "cpus_per_task": 1,
    }
    return Builder(fields=fields, now=now)


def _wrapped_command(argv: Sequence[str]) -> str | None:
    wrap = [g.value for g in tokenize(argv, stop_at_positional=False).given if g.name == "wrap"]
    return wrap[-1] if wrap and wrap[-1] else None


__all__ = ["CommandLine", "Parsed", "expand_pattern", "parse_submission", "split_command_line"]
