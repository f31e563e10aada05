"""Pure: `[reservations.NAME]` tables of the cluster configuration — advance
reservations for some accounts and maintenance windows, as Slurm's `scontrol create
reservation` makes them:

    [reservations.llm-run]          # nodes set aside for one account's big run
    start = 2026-12-01T08:00:00Z     # TOML datetime (or an ISO 8601 string), UTC if naive
    duration = "2-00:00:00"
    nodes = ["node[01-02]"]         # or: gpus = 8 (whole nodes, chosen by the placer)
    accounts = ["research"]

    [reservations.patch-tuesday]
    start = 2026-12-01T02:00:00Z
    duration = "2:00:00"
    recurrence = "weekly"           # none | daily | weekly
    maintenance = true              # nobody runs inside; jobs must end before it starts
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from . import config_read as r
from .hostlist import expand


class ReservationConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    start: float  # epoch seconds
    duration_s: int
    nodes: tuple[str, ...] = ()  # empty with gpus == 0: the whole cluster
    gpus: int = 0
    accounts: tuple[str, ...] = ()
    recurrence: str = "none"
    maintenance: bool = False


def _start(value: object, key: str, p: r.Problems) -> float | None:
    when: datetime | None = value if isinstance(value, datetime) else None
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            when = None
    if when is None:
        p.add(key, f"{value!r} is not a date and time; write e.g. 2026-12-01T08:00:00Z")
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


RESERVATION: dict[str, r.Reader] = {
    "start": _start,
    "duration": r.duration,
    "nodes": r.str_list,
    "gpus": r.whole,
    "accounts": r.str_list,
    "recurrence": r.one_of("none", "daily", "weekly"),
    "maintenance": r.boolean,
}


def reservation(
    name: str, body: dict[str, object], node_sets: dict[str, tuple[str, ...]], p: r.Problems
) -> ReservationConfig | None:
    key = f"reservations.{name}"
    f = r.fields(body, key, RESERVATION, p)
    for required in ("start", "duration"):
        if required not in body:
            p.add(f"{key}.{required}", f"a reservation needs {required}")
    if "start" not in f or "duration" not in f:
        return None
    maintenance = bool(f.get("maintenance", False))
    accounts = tuple(f.get("accounts", ()))
    if not maintenance and not accounts:
        p.add(f"{key}.accounts", "name the accounts that may run inside, or set maintenance")
    return ReservationConfig(
        name=name,
        start=f["start"],
        duration_s=int(f["duration"]),
        nodes=_nodes(tuple(f.get("nodes", ())), f"{key}.nodes", node_sets, p),
        gpus=int(f.get("gpus", 0)),
        accounts=accounts,
        recurrence=str(f.get("recurrence", "none")),
        maintenance=maintenance,
    )


def _nodes(
    exprs: tuple[str, ...], key: str, node_sets: dict[str, tuple[str, ...]], p: r.Problems
) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for expr in exprs:
        if expr in node_sets:
            names.update(dict.fromkeys(node_sets[expr]))
            continue
        try:
            names.update(dict.fromkeys(expand(expr)))
        except ValueError as err:
            p.add(key, f"{err}; expected a node_sets label or a hostlist")
    return tuple(names)
