"""Pure: parsers for single sbatch option values (counts, memory, GPUs, signals, ...).

Each parser returns a plain value or raises `ValueError` whose message says what was
wrong and what would be accepted; `sbatch.py` turns that into a `SubmitError`.
"""

from __future__ import annotations

import math
import re
import signal as _signal

import msgspec

from shared.jobspec import Dependency

from .timefmt import DURATION_FORMS, parse_duration

_COUNT = re.compile(r"[+-]?\d{1,9}")


def count(text: str, what: str, *, minimum: int = 1) -> int:
    """A whole number of `what` (nodes, GPUs, ...), at least `minimum`."""
    value = text.strip()
    if not _COUNT.fullmatch(value):
        raise ValueError(f"invalid {what} {text!r}: expected a whole number")
    n = int(value)
    if n < 0:
        raise ValueError(f"{what} cannot be negative ({n}); give {minimum} or more")
    if n < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {n}")
    return n


def node_range(text: str) -> tuple[int, int]:
    """`-N 4`, `-N 2-4` or `-N 2:4` (elastic) -> (min, max)."""
    value = text.strip()
    for sep in ("-", ":"):
        lo, found, hi = value.partition(sep)
        if found and lo:
            low = count(lo, "minimum node count")
            high = count(hi, "maximum node count")
            if high < low:
                raise ValueError(
                    f"invalid --nodes {text!r}: the maximum {high} is below the minimum {low}"
                )
            return low, high
    n = count(value, "node count")
    return n, n


_MEM = re.compile(r"(\d{1,12})([kmgt]?)b?", re.IGNORECASE)
_MEM_MIB = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}


def memory_mib(text: str) -> int:
    """`--mem` sizes: a number with an optional K/M/G/T suffix (default M), in MiB."""
    m = _MEM.fullmatch(text.strip())
    if not m:
        raise ValueError(
            f"invalid memory size {text!r}: expected a number with an optional K, M, G or T "
            "suffix, e.g. 64G"
        )
    # K rounds up to a whole MiB; 0 keeps Slurm's meaning "all of the node's memory".
    return math.ceil(int(m.group(1)) * _MEM_MIB[m.group(2).lower()])


def typed_gpus(text: str, what: str) -> tuple[str | None, int]:
    """`[type:]N` as taken by --gpus and --gpus-per-node -> (model, count)."""
    model, sep, number = text.strip().rpartition(":")
    if sep and not model:
        raise ValueError(f"invalid {what} {text!r}: expected [type:]count, e.g. a100:4")
    return (model or None), count(number, f"GPU count in {what}", minimum=0)


def gres_gpus(text: str) -> tuple[tuple[str | None, int] | None, list[str]]:
    """`--gres=gpu[:type][:N][,other...]` -> ((model, per-node count) or None, others)."""
    gpus: tuple[str | None, int] | None = None
    others: list[str] = []
    for item in text.split(","):
        fields = item.strip().split(":")
        if fields[0] != "gpu":
            if fields[0] == "none" or not fields[0]:
                continue
            others.append(fields[0])
            continue
        if len(fields) == 1:
            gpus = (None, 1)
        elif len(fields) == 2:
            gpus = (None, 1) if not fields[1].strip() else _gres_tail(fields[1], item)
        elif len(fields) == 3:
            gpus = (fields[1] or None, count(fields[2], f"GPU count in --gres {item!r}", minimum=0))
        else:
            raise ValueError(f"invalid --gres {item!r}: expected gpu[:type][:count]")
    return gpus, others


def _gres_tail(field: str, item: str) -> tuple[str | None, int]:
    # `gpu:4` is a count; `gpu:a100` is a type with the implied count 1.
    if _COUNT.fullmatch(field.strip()):
        return None, count(field, f"GPU count in --gres {item!r}", minimum=0)
    return field, 1


_SIGNAL_NAMES = {s.name.removeprefix("SIG"): s.value for s in _signal.Signals}


def signal_spec(text: str) -> tuple[str, int, bool, bool]:
    """`[{R|B}:]SIG[@secs]` -> (name without SIG, seconds before the end, B:, R:)."""
    value = text.strip()
    batch_only = reservation = False
    flag, sep, rest = value.partition(":")
    if sep and flag.upper() in ("B", "R", "RB", "BR"):
        batch_only, reservation = "B" in flag.upper(), "R" in flag.upper()
        value = rest
    sig, at, secs = value.partition("@")
    before = count(secs, "seconds in --signal", minimum=0) if at else 60
    if before > 65535:
        raise ValueError(f"invalid --signal {text!r}: at most 65535 seconds before the end")
    name = sig.strip().upper().removeprefix("SIG")
    if name.isdigit():
        by_number = {v: k for k, v in _SIGNAL_NAMES.items()}
        if int(name) not in by_number:
            raise ValueError(f"invalid --signal {text!r}: no signal number {name}")
        name = by_number[int(name)]
    if name not in _SIGNAL_NAMES:
        raise ValueError(
            f"invalid --signal {text!r}: expected [B:]SIGNAL[@seconds], e.g. B:USR1@90, "
            "with a signal name such as USR1, TERM or a number"
        )
    return name, before, batch_only, reservation


def switches(text: str) -> tuple[int, int]:
    """`--switches=K[@max-wait]` -> (K, seconds to wait for that many switches)."""
    k, at, wait = text.strip().partition("@")
    limit = count(k, "switch count")
    seconds = 0
    if at:
        parsed = parse_duration(wait)
        if parsed is None:
            raise ValueError(f"invalid --switches {text!r}: the wait after @ must be finite")
        seconds = parsed
    return limit, seconds


DEPENDENCY_KINDS = ("after", "afterany", "afterok", "afternotok", "aftercorr", "singleton")
_DEP_ID = re.compile(r"(\d{1,12})(?:_(\d{1,9}))?(?:\+(\d{1,9}))?")  # JOB[_TASK][+MIN]


def dependencies(text: str) -> tuple[tuple[Dependency, ...], bool]:
    """`-d afterok:1:2,singleton` -> (terms, any_is_enough); `?` separates "any" terms.

    `+N` after a job id is a delay in minutes (Slurm allows it on `after` only); ids with
    different delays become separate terms, which only keeps the meaning when all terms
    must hold, so mixing them with `?` is refused.
    """
    value = text.strip()
    if "," in value and "?" in value:
        raise ValueError(
            f"invalid --dependency {text!r}: use either ',' (all must hold) or '?' "
            "(any one is enough), not both"
        )
    any_of = "?" in value
    terms: list[Dependency] = []
    for raw in value.split("?" if any_of else ","):
        terms.extend(_dependency_term(raw.strip(), text, any_of))
    return tuple(terms), any_of


def _dependency_term(raw: str, text: str, any_of: bool) -> list[Dependency]:
    kind, _, ids_text = raw.partition(":")
    kind = kind.lower()
    if kind not in DEPENDENCY_KINDS:
        raise ValueError(
            f"invalid --dependency {text!r}: {kind!r} is not one of "
            f"{', '.join(DEPENDENCY_KINDS)} (each as type:jobid[:jobid...])"
        )
    if kind == "singleton":
        if ids_text:
            raise ValueError(f"invalid --dependency {text!r}: singleton takes no job ids")
        return [Dependency(kind=kind)]
    by_delay: dict[int, list[int]] = {}
    tasks: dict[int, list[tuple[int, int]]] = {}
    for item in ids_text.split(":"):
        m = _DEP_ID.fullmatch(item.strip())
        if not m:
            raise ValueError(
                f"invalid --dependency {text!r}: {item!r} is not a job id "
                f"(expected {kind}:jobid[_task][+minutes][:jobid...])"
            )
        if m.group(3) is not None and kind != "after":
            raise ValueError(
                f"invalid --dependency {text!r}: a +minutes delay is allowed only with "
                "'after' (after:jobid+minutes)"
            )
        delay = int(m.group(3) or 0) * 60
        by_delay.setdefault(delay, [])
        if m.group(2) is None:
            by_delay[delay].append(int(m.group(1)))
        else:  # an array's task: its own job id is looked up at admission
            tasks.setdefault(delay, []).append((int(m.group(1)), int(m.group(2))))
    if len(by_delay) > 1 and any_of:
        raise ValueError(
            f"invalid --dependency {text!r}: different +delays inside one term cannot be "
            "combined with '?'; write one term per delay"
        )
    return [
        Dependency(kind=kind, job_ids=tuple(ids), delay_s=d, tasks=tuple(tasks.get(d, ())))
        for d, ids in by_delay.items()
    ]


def resolve_tasks(
    terms: tuple[Dependency, ...], found: dict[tuple[int, int], int]
) -> tuple[tuple[Dependency, ...], list[str]]:
    """Each term's `ARRAY_TASK` refs replaced by the tasks' job ids (`found`, read from
    the database); or the terms as they were and those not found, as written (`12_7`)."""
    missing = sorted({f"{a}_{t}" for d in terms for a, t in d.tasks if (a, t) not in found})
    if missing:
        return terms, missing
    return tuple(
        msgspec.structs.replace(
            d, job_ids=tuple(dict.fromkeys((*d.job_ids, *(found[t] for t in d.tasks)))), tasks=()
        )
        if d.tasks
        else d
        for d in terms
    ), []


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def export(text: str) -> tuple[str, dict[str, str]]:
    """`--export=ALL|NONE|NIL|[ALL,]NAME[=value],...` -> (mode and names, explicit values)."""
    value = text.strip()
    mode_parts: list[str] = []
    env: dict[str, str] = {}
    for item in value.split(","):
        name, eq, val = item.partition("=")
        if name.upper() in ("ALL", "NONE", "NIL") and not eq:
            mode_parts.append(name.upper())
            continue
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"invalid --export {text!r}: {name!r} is not a variable name; expected "
                "ALL, NONE or a comma list of NAME or NAME=value"
            )
        if eq:
            env[name] = val
        else:
            mode_parts.append(name)
    # Only NAME=value items (no ALL) export just those, as sbatch does.
    return ",".join(mode_parts) if mode_parts else "NONE", env


def nice(text: str | None) -> int:
    """`--nice` alone is +100, as in Slurm; `--nice=N` takes -2147483645..2147483645."""
    if text is None:
        return 100
    if not _COUNT.fullmatch(text.strip()):
        raise ValueError(f"invalid --nice {text!r}: expected a whole number such as 100 or -50")
    n = int(text)
    if abs(n) > 2147483645:
        raise ValueError(f"invalid --nice {text!r}: must be within +-2147483645")
    return n


def duration_or_error(text: str, what: str) -> int | None:
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(f"invalid {what} {text!r}: expected {DURATION_FORMS}") from None


def new_time_limit(text: str, what: str) -> int:
    """A job's new time limit as written (`muster update --time`, scontrol's
    `TimeLimit=`): a duration above 0; UNLIMITED, which a submission may ask, is not."""
    seconds = duration_or_error(text, what)
    if not seconds:
        raise ValueError(f"invalid {what} {text!r}: give a limit above 0 (UNLIMITED is not one)")
    return seconds


def limit_update(text: str, what: str) -> tuple[int | None, int | None]:
    """A job's new time limit as written: whole (`2:00:00` -> (7200, None)), or a change
    of each job's own, Slurm's relative form (`+30` -> (None, 1800), `-30` -> (None,
    -1800))."""
    body = text.strip()
    if body[:1] not in ("+", "-"):
        return new_time_limit(text, what), None
    try:
        seconds = new_time_limit(body[1:], what)
    except ValueError:
        raise ValueError(
            f"invalid {what} {text!r}: expected + or - then a duration above 0 ({DURATION_FORMS})"
        ) from None
    return None, seconds if body[0] == "+" else -seconds
