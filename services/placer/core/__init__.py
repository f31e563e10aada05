"""Pure core of the placer: snapshot in, plan out (no I/O, no clock, no randomness)."""

from services.placer.core.kept import place_keeping
from services.placer.core.model import (
    MUSTER_POLICY,
    Backfill,
    Blocker,
    Fit,
    Gpu,
    Grant,
    JobRequest,
    Limit,
    Limits,
    Node,
    Plan,
    PolicyConfig,
    Preempt,
    QosLimit,
    Recurrence,
    Reservation,
    Running,
    Snapshot,
    Start,
    Wait,
    Waiting,
    describe,
)
from services.placer.core.order import rank_key
from services.placer.core.place import Prepared, order_key, place, prepare
from services.placer.core.spares import place_spares
from shared.states import NodeState  # the one enum, re-exported for the core's users

__all__ = [
    "MUSTER_POLICY",
    "Backfill",
    "Blocker",
    "Fit",
    "Gpu",
    "Grant",
    "JobRequest",
    "Limit",
    "Limits",
    "Node",
    "NodeState",
    "Plan",
    "PolicyConfig",
    "Preempt",
    "Prepared",
    "QosLimit",
    "Recurrence",
    "Reservation",
    "Running",
    "Snapshot",
    "Start",
    "Wait",
    "Waiting",
    "describe",
    "order_key",
    "place",
    "place_keeping",
    "place_spares",
    "prepare",
    "rank_key",
]
