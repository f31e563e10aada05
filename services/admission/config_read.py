"""Pure plumbing for config.py: read TOML tables key by key, recording each problem.

A schema maps each accepted key to a reader; a reader returns the checked value or
records a problem (with the dotted key and what would be accepted) and returns None.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from shared.identity import public_key_bytes
from shared.privacy import PrivateData

from .timefmt import DURATION_FORMS, parse_duration
from .values import memory_mib


class ConfigProblem(msgspec.Struct, frozen=True):
    key: str  # dotted TOML key, e.g. "partitions.debug.max_time"
    message: str


@dataclass
class Problems:
    items: list[ConfigProblem] = field(default_factory=list)

    def add(self, key: str, message: str) -> None:
        self.items.append(ConfigProblem(key, message))


Reader = Callable[[object, str, Problems], Any]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def unknown_keys(body: dict[str, object], path: str, known: Iterable[str], p: Problems) -> None:
    accepted = tuple(known)
    for key in body:
        if key not in accepted:
            p.add(_join(path, key), f"unknown key; accepted here: {', '.join(accepted)}")


def table(doc: dict[str, object], key: str, p: Problems) -> dict[str, object]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        p.add(key, f"expected a table [{key}], got {type(value).__name__}")
        return {}
    return value


def named_tables(doc: dict[str, object], key: str, p: Problems) -> dict[str, dict[str, object]]:
    """`[key.NAME]` tables -> {NAME: body}."""
    out: dict[str, dict[str, object]] = {}
    for name, body in table(doc, key, p).items():
        if not isinstance(body, dict):
            p.add(f"{key}.{name}", f"expected a table [{key}.{name}], got {type(body).__name__}")
            continue
        out[name] = body
    return out


def fields(
    body: dict[str, object], path: str, schema: dict[str, Reader], p: Problems
) -> dict[str, Any]:
    unknown_keys(body, path, schema, p)
    out: dict[str, Any] = {}
    for key, reader in schema.items():
        if key in body:
            value = reader(body[key], _join(path, key), p)
            if value is not None:
                out[key] = value
    return out


def string(value: object, key: str, p: Problems) -> str | None:
    if isinstance(value, str) and value:
        return value
    p.add(key, f"expected a non-empty string, got {value!r}")
    return None


def boolean(value: object, key: str, p: Problems) -> bool | None:
    if isinstance(value, bool):
        return value
    p.add(key, f"expected true or false, got {value!r}")
    return None


def _int(minimum: int) -> Reader:
    def reader(value: object, key: str, p: Problems) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        p.add(key, f"expected a whole number of at least {minimum}, got {value!r}")
        return None

    return reader


whole = _int(0)
positive = _int(1)


def any_int(value: object, key: str, p: Problems) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    p.add(key, f"expected a whole number, got {value!r}")
    return None


def _duration(unlimited_ok: bool) -> Reader:
    forms = DURATION_FORMS if unlimited_ok else DURATION_FORMS.replace(" or UNLIMITED", "")

    def reader(value: object, key: str, p: Problems) -> int | None:
        if isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except ValueError:
                seconds = -1
            if seconds is None and unlimited_ok:
                return None
            if seconds is not None and seconds >= 0:
                return seconds
        p.add(key, f'expected a duration string ({forms}), e.g. "72:00:00", got {value!r}')
        return None

    return reader


duration = _duration(False)
limit_duration = _duration(True)


def memory_size(value: object, key: str, p: Problems) -> int | None:
    """A memory size in MiB: a whole number (MiB) or `--mem`'s text ("8G", "512M")."""
    mib: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        mib = value
    elif isinstance(value, str):
        try:
            mib = memory_mib(value)
        except ValueError:
            mib = None
    if mib is not None and mib > 0:
        return mib
    p.add(key, f'expected a memory size above 0: MiB, or "8G", "512M", got {value!r}')
    return None


def str_list(value: object, key: str, p: Problems) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        return tuple(value)
    p.add(key, f'expected a list of strings, e.g. ["a", "b"], got {value!r}')
    return ()


def names_or_tiers(value: object, key: str, p: Problems) -> tuple[str | int, ...]:
    if isinstance(value, list) and all(
        (isinstance(v, str) and v) or (isinstance(v, int) and not isinstance(v, bool))
        for v in value
    ):
        return tuple(value)
    p.add(key, f"expected a list of partition names or priority tiers (numbers), got {value!r}")
    return ()


def private_data(value: object, key: str, p: Problems) -> tuple[str, ...] | None:
    items = str_list(value, key, p) if value != [] else ()
    bad = [v for v in items if v not in set(PrivateData)]
    if bad:
        p.add(key, f"unknown {', '.join(map(repr, bad))}; accepted: {', '.join(PrivateData)}")
        return None
    return items


def one_of(*choices: str) -> Reader:
    def reader(value: object, key: str, p: Problems) -> str | None:
        if value in choices:
            return str(value)
        p.add(key, f"expected one of {', '.join(choices)}, got {value!r}")
        return None

    return reader


def weights(value: object, key: str, p: Problems) -> dict[str, float] | None:
    if isinstance(value, dict) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in value.values()
    ):
        return {str(k): float(v) for k, v in value.items()}
    p.add(
        key,
        f"expected a table of GPU model = weight (0 or more), e.g. {{ H100 = 2.0 }}, got {value!r}",
    )
    return None


def weight(value: object, key: str, p: Problems) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    p.add(key, f"expected a number of 0 or more, got {value!r}")
    return None


def public_keys(value: object, key: str, p: Problems) -> tuple[str, ...]:
    keys = str_list(value, key, p)
    for text in keys:
        try:
            public_key_bytes(text)
        except ValueError as err:
            p.add(key, f"{err}; `muster keygen` prints a user's public key")
    return keys


def positive_number(value: object, key: str, p: Problems) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    p.add(key, f"expected a number above 0, got {value!r}")
    return None


CLUSTER: dict[str, Reader] = {
    "name": string,
    "default_partition": string,
    "default_qos": string,
    "max_array_index": whole,
    "private_data": private_data,
}
PARTITION: dict[str, Reader] = {
    "nodes": str_list,
    "default_time": duration,
    "max_time": limit_duration,
    "max_nodes": positive,
    "max_gpus_per_job": positive,
    "priority_tier": any_int,
    "preempt_mode": one_of("off", "requeue", "cancel"),
    "grace_time": duration,
    "allowed_accounts": str_list,
    "allowed_qos": str_list,
    "default_qos": string,
    "requires_approval": boolean,
    "can_preempt": names_or_tiers,
    "reserved_gpus": whole,
    # The --mem a job that gives none gets (Slurm's DefMemPerGPU / DefMemPerCPU): per GPU
    # of a node, or per CPU; one of the two
    "def_mem_per_gpu": memory_size,
    "def_mem_per_cpu": memory_size,
    # Storage I/O of its jobs (docs/isolation.md): a weight and byte-rate caps.
    "io_weight": positive,
    "io_read_bps": positive,
    "io_write_bps": positive,
}
QOS: dict[str, Reader] = {
    "priority": any_int,
    "max_gpus_per_user": whole,
    "max_running_jobs_per_user": whole,
    "max_submitted_jobs_per_user": whole,
    "max_gpus_per_account": whole,
    "max_running_jobs_per_account": whole,
    "max_submitted_jobs_per_account": whole,
    "min_runtime": duration,
    "preempt": str_list,
}
ACCOUNT: dict[str, Reader] = {
    "parent": string,
    "shares": positive,
    "coordinators": str_list,
    "description": string,
    "io_weight": positive,
    "io_read_bps": positive,
    "io_write_bps": positive,
}
USER: dict[str, Reader] = {"accounts": str_list, "default_account": string, "keys": public_keys}
LIMITS: dict[str, Reader] = {
    "submit_rate": positive_number,
    "submit_burst": positive,
    "max_script_bytes": positive,
    "max_request_bytes": positive,
}
ROLES: dict[str, Reader] = {"operators": str_list}
BILLING: dict[str, Reader] = {"default_gpu_weight": weight, "gpu_weights": weights}
