"""Pure: the sbatch option table and a getopt_long-style tokenizer, shared by admission
(which reads `#SBATCH` directives and the submitted argv) and the `muster` CLI (which
finds the script path in `muster submit`'s words), so the two can never disagree on
which options take a value.

Every real sbatch long option is listed, so an option Muster does not implement is
recognised (and warned about by the caller) while one sbatch itself does not know is
refused the way sbatch refuses it. Long options may be abbreviated to any unique
prefix, as getopt_long allows; short options take their value attached (`-N2`) or as
the next word (`-N 2`); flags may be grouped (`-Hk`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # mypy takes it as true; `typing` costs a one-shot command to import
if TYPE_CHECKING:
    from collections.abc import Sequence

# Plain records, not msgspec structs or an Enum: `muster submit` and `sbatch` split their
# words with this module on every call, and those imports cost a one-shot command more
# than all its own work (tests/unit/cli/test_hot_path.py).


class _Record:
    """A frozen value compared by its fields (those in `__slots__`)."""

    __slots__: tuple[str, ...] = ()

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Record)
            and type(other) is type(self)
            and self._fields() == other._fields()
        )

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({inner})"

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def _set(self, **values: object) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)


class Arg:
    """Whether an option takes a value (getopt_long's has_arg)."""

    NONE = "none"
    REQUIRED = "required"
    OPTIONAL = "optional"  # only `--opt=value` passes a value, as with getopt


class Spec(_Record):
    __slots__ = ("arg", "long", "short")
    long: str
    short: str | None
    arg: str  # an Arg value

    def __init__(self, long: str, short: str | None, arg: str) -> None:
        self._set(long=long, short=short, arg=arg)


_N, _R, _O = Arg.NONE, Arg.REQUIRED, Arg.OPTIONAL

# The sbatch options (Slurm 23/24 man page) plus Muster's own extras at the end.
TABLE: tuple[Spec, ...] = (
    Spec("account", "A", _R),
    Spec("acctg-freq", None, _R),
    Spec("array", "a", _R),
    Spec("batch", None, _R),
    Spec("bb", None, _R),
    Spec("bbf", None, _R),
    Spec("begin", "b", _R),
    Spec("chdir", "D", _R),
    Spec("cluster-constraint", None, _R),
    Spec("clusters", "M", _R),
    Spec("comment", None, _R),
    Spec("constraint", "C", _R),
    Spec("container", None, _R),
    Spec("container-id", None, _R),
    Spec("contiguous", None, _N),
    Spec("core-spec", "S", _R),
    Spec("cores-per-socket", None, _R),
    Spec("cpu-freq", None, _R),
    Spec("cpus-per-gpu", None, _R),
    Spec("cpus-per-task", "c", _R),
    Spec("deadline", None, _R),
    Spec("delay-boot", None, _R),
    Spec("dependency", "d", _R),
    Spec("distribution", "m", _R),
    Spec("error", "e", _R),
    Spec("exclude", "x", _R),
    Spec("exclusive", None, _O),
    Spec("export", None, _R),
    Spec("export-file", None, _R),
    Spec("extra", None, _R),
    Spec("extra-node-info", "B", _R),
    Spec("get-user-env", None, _O),
    Spec("gid", None, _R),
    Spec("gpu-bind", None, _R),
    Spec("gpu-freq", None, _R),
    Spec("gpus", "G", _R),
    Spec("gpus-per-node", None, _R),
    Spec("gpus-per-socket", None, _R),
    Spec("gpus-per-task", None, _R),
    Spec("gres", None, _R),
    Spec("gres-flags", None, _R),
    Spec("help", "h", _N),
    Spec("hint", None, _R),
    Spec("hold", "H", _N),
    Spec("ignore-pbs", None, _N),
    Spec("input", "i", _R),
    Spec("job-name", "J", _R),
    Spec("kill-on-invalid-dep", None, _R),
    Spec("licenses", "L", _R),
    Spec("mail-type", None, _R),
    Spec("mail-user", None, _R),
    Spec("mcs-label", None, _R),
    Spec("mem", None, _R),
    Spec("mem-bind", None, _R),
    Spec("mem-per-cpu", None, _R),
    Spec("mem-per-gpu", None, _R),
    Spec("mincpus", None, _R),
    Spec("network", None, _R),
    Spec("nice", None, _O),
    Spec("no-kill", "k", _O),
    Spec("no-requeue", None, _N),
    Spec("nodefile", "F", _R),
    Spec("nodelist", "w", _R),
    Spec("nodes", "N", _R),
    Spec("ntasks", "n", _R),
    Spec("ntasks-per-core", None, _R),
    Spec("ntasks-per-gpu", None, _R),
    Spec("ntasks-per-node", None, _R),
    Spec("ntasks-per-socket", None, _R),
    Spec("oom-kill-step", None, _O),
    Spec("open-mode", None, _R),
    Spec("output", "o", _R),
    Spec("overcommit", "O", _N),
    Spec("oversubscribe", "s", _N),
    Spec("parsable", None, _N),
    Spec("partition", "p", _R),
    Spec("power", None, _R),
    Spec("prefer", None, _R),
    Spec("priority", None, _R),
    Spec("profile", None, _R),
    Spec("propagate", None, _O),
    Spec("qos", "q", _R),
    Spec("quiet", "Q", _N),
    Spec("reboot", None, _N),
    Spec("requeue", None, _N),
    Spec("reservation", None, _R),
    Spec("signal", None, _R),
    Spec("sockets-per-node", None, _R),
    Spec("spread-job", None, _N),
    Spec("switches", None, _R),
    Spec("test-only", None, _N),
    Spec("thread-spec", None, _R),
    Spec("threads-per-core", None, _R),
    Spec("time", "t", _R),
    Spec("time-min", None, _R),
    Spec("tmp", None, _R),
    Spec("tres-bind", None, _R),
    Spec("tres-per-task", None, _R),
    Spec("uid", None, _R),
    Spec("usage", None, _N),
    Spec("use-min-nodes", None, _N),
    Spec("verbose", "v", _N),
    Spec("version", "V", _N),
    Spec("wait", "W", _N),
    Spec("wait-all-nodes", None, _R),
    Spec("wckey", None, _R),
    Spec("wrap", None, _R),
    # Muster's own.
    Spec("torchrun", None, _N),
    Spec("ray", None, _N),
    Spec("batch-nodes", None, _R),
    # pyxis's (NVIDIA's Slurm container plugin) names.
    Spec("container-image", None, _R),
    Spec("container-mounts", None, _R),
    Spec("container-workdir", None, _R),
    Spec("dry-run", None, _N),
)

# The options a command keeps for itself before the script, every other word being
# sbatch's or the script's: `muster submit`'s and the sbatch shim's (muster/cli.py,
# muster/shims.py and their lean path, muster/lean.py)
SUBMIT_OWN = tuple(Spec(n, None, Arg.NONE) for n in ("json", "dry-run", "help"))
SBATCH_OWN = (Spec("parsable", None, Arg.NONE), Spec("wait", "W", Arg.NONE))

BY_LONG = {s.long: s for s in TABLE}
BY_SHORT = {s.short: s for s in TABLE if s.short}
MUSTER_ONLY = frozenset(
    {
        "torchrun",
        "ray",
        "batch-nodes",
        "dry-run",
        "container-image",
        "container-mounts",
        "container-workdir",
    }
)


class Given(_Record):
    """One option as written: its canonical long name, its value, and how it was spelt."""

    __slots__ = ("name", "spelt", "value")
    name: str
    value: str | None
    spelt: str

    def __init__(self, name: str, value: str | None, spelt: str) -> None:
        self._set(name=name, value=value, spelt=spelt)


class Problem(_Record):
    """A tokenizing failure: `kind` is unknown/ambiguous/missing/unexpected."""

    __slots__ = ("kind", "message", "name")
    kind: str
    message: str
    name: str

    def __init__(self, kind: str, message: str, name: str = "") -> None:
        self._set(kind=kind, message=message, name=name)


class Tokens(_Record):
    __slots__ = ("given", "positional", "problems")
    given: tuple[Given, ...]
    positional: tuple[str, ...]  # the first non-option word and everything after it
    problems: tuple[Problem, ...]

    def __init__(
        self, given: tuple[Given, ...], positional: tuple[str, ...], problems: tuple[Problem, ...]
    ) -> None:
        self._set(given=given, positional=positional, problems=problems)


# Other spellings sbatch takes (older or srun's names) for one of its options
ALIASES = {"tasks-per-node": "ntasks-per-node"}


def lookup_long(word: str, table: Sequence[Spec] = TABLE) -> Spec | Problem:
    by_long = BY_LONG if table is TABLE else {s.long: s for s in table}
    if word in by_long:
        return by_long[word]
    if table is TABLE and word in ALIASES:
        return by_long[ALIASES[word]]
    matches = [s for s in table if s.long.startswith(word)] if word else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(f"--{s.long}" for s in matches)
        return Problem("ambiguous", f"option '--{word}' is ambiguous; possibilities: {names}", word)
    return Problem("unknown", f"unrecognized option '--{word}'", word)


def _long(
    arg: str, rest: Sequence[str], table: Sequence[Spec] = TABLE
) -> tuple[Given | Problem, int]:
    """One `--name[=value]` word; returns what it means and how many following words it used."""
    word, eq, inline = arg[2:].partition("=")
    found = lookup_long(word, table)
    if isinstance(found, Problem):
        return found, 0
    if found.arg == Arg.NONE:
        if eq:
            msg = f"option '--{found.long}' doesn't allow an argument"
            return Problem("unexpected", msg, found.long), 0
        return Given(found.long, None, arg), 0
    if eq or found.arg == Arg.OPTIONAL:
        return Given(found.long, inline if eq else None, arg), 0
    if not rest:
        msg = f"option '--{found.long}' requires an argument"
        return Problem("missing", msg, found.long), 0
    return Given(found.long, rest[0], f"{arg} {rest[0]}"), 1


def _short(arg: str, rest: Sequence[str]) -> tuple[list[Given | Problem], int]:
    out: list[Given | Problem] = []
    i = 1
    while i < len(arg):
        letter = arg[i]
        spec = BY_SHORT.get(letter)
        if spec is None:
            out.append(Problem("unknown", f"invalid option -- '{letter}'", letter))
            return out, 0
        if spec.arg == Arg.REQUIRED:
            attached = arg[i + 1 :]
            if attached:
                out.append(Given(spec.long, attached, arg))
                return out, 0
            if not rest:
                msg = f"option requires an argument -- '{letter}'"
                out.append(Problem("missing", msg, spec.long))
                return out, 0
            out.append(Given(spec.long, rest[0], f"{arg} {rest[0]}"))
            return out, 1
        out.append(Given(spec.long, None, f"-{letter}"))
        i += 1
    return out, 0


def tokenize(argv: Sequence[str], *, stop_at_positional: bool = True) -> Tokens:
    """Split argv into options and positionals; never raises.

    With `stop_at_positional`, the first non-option word ends option parsing (the
    script name, as sbatch treats it); `--` always ends it.
    """
    given: list[Given] = []
    problems: list[Problem] = []
    positional: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        rest = argv[i + 1 :]
        if arg == "--":
            positional.extend(argv[i + 1 :])
            break
        if arg.startswith("--"):
            item, used = _long(arg, rest)
            items: list[Given | Problem] = [item]
        elif arg.startswith("-") and len(arg) > 1:
            items, used = _short(arg, rest)
        else:
            if stop_at_positional:
                positional.extend(argv[i:])
                break
            positional.append(arg)
            items, used = [], 0
        for item in items:
            if isinstance(item, Given):
                given.append(item)
            else:
                problems.append(item)
        i += 1 + used
    return Tokens(tuple(given), tuple(positional), tuple(problems))


class CommandLine(_Record):
    """`muster submit` argv split into the options, the script path and its arguments."""

    __slots__ = ("args", "options", "script")
    options: tuple[str, ...]
    script: str | None
    args: tuple[str, ...]

    def __init__(
        self, *, options: tuple[str, ...], script: str | None, args: tuple[str, ...]
    ) -> None:
        self._set(options=options, script=script, args=args)


def split_command_line(argv: Sequence[str]) -> CommandLine:
    """Find the script name the way sbatch does: the first word that is not an option
    or an option's value. With `--wrap` there is no script and every word is an option."""
    tokens = tokenize(argv)
    cut = len(argv) - len(tokens.positional)
    options = tuple(argv[:cut])
    if cut and argv[cut - 1] == "--":
        options = options[:-1]
    if not tokens.positional:
        return CommandLine(options=options, script=None, args=())
    return CommandLine(
        options=options, script=tokens.positional[0], args=tuple(tokens.positional[1:])
    )


class OwnLine(_Record):
    """A command line whose caller keeps some options (`own`) for itself: those found
    among the options before the script, and the rest split as sbatch would."""

    __slots__ = ("line", "own")
    own: tuple[Given, ...]
    line: CommandLine

    def __init__(self, *, own: tuple[Given, ...], line: CommandLine) -> None:
        self._set(own=own, line=line)


def split_own(argv: Sequence[str], own: Sequence[Spec]) -> OwnLine:
    """Like `split_command_line`, but the options in `own` (flags, e.g. the CLI's
    `--json`; salloc's `-I[N]`) are taken out of the options: long ones in any form,
    short ones as a word of their own (`-W`, `-I5`). Only words before the script are
    options: the script's own arguments are never looked at, whatever they look like."""
    table = (*TABLE, *own)
    names = {s.long for s in own}
    shorts = {s.short: s for s in own if s.short}
    kept: list[Given] = []
    words: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            words.extend(argv[i:])
            break
        used = 0
        if arg.startswith("--"):
            item, used = _long(arg, argv[i + 1 :], table)
            if isinstance(item, Given) and item.name in names:
                kept.append(item)
                i += 1
                continue
        else:
            mine = shorts.get(arg[1])
            if mine is not None and (len(arg) == 2 or mine.arg != Arg.NONE):
                value = arg[2:] or None
                if value is None and mine.arg == Arg.REQUIRED and i + 1 < len(argv):
                    value, i = argv[i + 1], i + 1
                kept.append(Given(mine.long, value, arg))
                i += 1
                continue
            _, used = _short(arg, argv[i + 1 :])
        words.extend(argv[i : i + 1 + used])
        i += 1 + used
    return OwnLine(own=tuple(kept), line=split_command_line(words))
