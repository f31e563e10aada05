"""Pure core of the chaos harness: a seeded fault schedule.

`schedule(seed, kinds, n_faults, duration)` draws `n_faults` faults from `kinds` over
`duration` seconds, each at its own moment, aimed at one target of its kind and held for
a drawn time before it is undone (a killed process restarted, a paused one continued, a
partition healed). The same seed gives the same schedule, so a failing run is replayed
from its seed alone. No clock, no I/O: the harness (tests/chaos/harness.py) carries the
faults out.

Faults follow each other: one is undone before the next begins, so the cluster is never
asked to survive more than one fault at a time (a design limit, not a shortcut: two
partitioned nodes out of three is an outage of ours, which the health monitor waits
out by design).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    KILL_SERVICE = "kill_service"  # SIGKILL a service replica, start it again
    PAUSE_SERVICE = "pause_service"  # SIGSTOP a service replica, SIGCONT it
    KILL_AGENT = "kill_agent"  # SIGKILL a node agent (its workers live on), start it again
    PAUSE_AGENT = "pause_agent"  # SIGSTOP a node agent, SIGCONT it
    KILL_POSTGRES = "kill_postgres"  # kill -9 PostgreSQL, restart it on its port and folder
    KILL_NATS = "kill_nats"  # kill -9 a NATS server, restart it on its port and store
    PARTITION = "partition"  # take a node's link down, bring it up again
    XID_APP = "xid_app"  # an application XID on a node's GPU: the job fails, not the node
    XID_NODE = "xid_node"  # a node-failing XID; an operator resumes the node after the hold
    CRASH_NODE = "crash_node"  # kill -9 a node whole (agent, stepds, workers), start its agent
    FREEZE_NODE = "freeze_node"  # SIGSTOP a node whole (agent, stepds, workers), SIGCONT it


ALL_KINDS: tuple[Kind, ...] = tuple(Kind)

# How long each kind is held, in seconds (min, max). NATS comes back within the agents'
# fence (MUSTER_FENCE_S, 3 s in the chaos settings) so its outage stops no worker; the
# others range past SUSPECT and DOWN, so some faults move jobs and some do not.
HOLD_S: dict[Kind, tuple[float, float]] = {
    Kind.KILL_SERVICE: (0.2, 2.0),
    Kind.PAUSE_SERVICE: (0.5, 4.0),
    Kind.KILL_AGENT: (0.2, 2.0),
    Kind.PAUSE_AGENT: (0.5, 6.0),
    Kind.KILL_POSTGRES: (0.5, 4.0),
    Kind.KILL_NATS: (0.3, 1.5),
    Kind.PARTITION: (1.0, 7.0),
    Kind.XID_APP: (0.0, 0.0),
    Kind.XID_NODE: (1.0, 3.0),
    Kind.CRASH_NODE: (0.5, 6.0),
    Kind.FREEZE_NODE: (0.5, 8.0),
}
GAP_S = 1.0  # at least this long between one fault's end and the next one's start


@dataclass(frozen=True)
class Targets:
    """What faults can aim at: service replica keys, node names, NATS server keys."""

    services: tuple[str, ...]
    nodes: tuple[str, ...]
    nats_servers: tuple[str, ...] = ("server-nats",)
    gpus_per_node: int = 1


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the fault phase began
    kind: Kind
    target: str  # a service key, a node name, a NATS server key, "" for PostgreSQL
    hold_s: float
    gpu: int = 0  # for the XID kinds


def _target(rng: random.Random, kind: Kind, targets: Targets) -> str:
    if kind in (Kind.KILL_SERVICE, Kind.PAUSE_SERVICE):
        return rng.choice(targets.services)
    if kind is Kind.KILL_NATS:
        return rng.choice(targets.nats_servers)
    if kind is Kind.KILL_POSTGRES:
        return ""
    return rng.choice(targets.nodes)


def schedule(
    seed: int,
    kinds: Sequence[Kind],
    n_faults: int,
    duration: float,
    targets: Targets,
) -> list[Fault]:
    """`n_faults` faults of `kinds` in `duration` seconds, one after another, drawn from
    `seed` alone. Each fault gets an equal slot; it starts at a drawn moment of its slot
    early enough that its hold and the gap fit before the next slot."""
    if n_faults <= 0 or not kinds:
        return []
    rng = random.Random(seed)
    slot = duration / n_faults
    faults: list[Fault] = []
    for i in range(n_faults):
        kind = rng.choice(tuple(kinds))
        low, high = HOLD_S[kind]
        hold = round(min(rng.uniform(low, high), max(slot - GAP_S, 0.0)), 2)
        slack = max(slot - hold - GAP_S, 0.0)
        at = round(i * slot + rng.uniform(0.0, slack), 2)
        gpu = rng.randrange(targets.gpus_per_node) if kind in (Kind.XID_APP, Kind.XID_NODE) else 0
        faults.append(Fault(at, kind, _target(rng, kind, targets), hold, gpu))
    return faults


def counts(faults: Sequence[Fault]) -> dict[str, int]:
    """How many faults of each kind, every kind named (0 where none)."""
    out = dict.fromkeys((k.value for k in Kind), 0)
    for f in faults:
        out[f.kind.value] += 1
    return out
