"""Pure core of the placer: snapshot in, plan out (no I/O, no clock, no randomness)."""

from services.placer.core.kept import place_keeping
from services.placer.core.model import (
    Blocker,
    Gpu,
    Grant,
    JobRequest,
    Limit,
    Limits,
    Node,
    NodeState,
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
)
from services.placer.core.place import Prepared, order_key, place, prepare
from services.placer.core.spares import place_spares

__all__ = [
    "Blocker",
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
    "order_key",
    "place",
    "place_keeping",
    "place_spares",
    "prepare",
]
