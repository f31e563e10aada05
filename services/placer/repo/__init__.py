"""Placer SQL, one module per concern; every function takes a connection already inside
a transaction, loads facts or writes what the core decided, and decides nothing.

- `lease`: the leader lease and its fencing epoch
- `snapshot`: nodes, GPUs, running allocations, policy and priorities -> core types
- `pending`: the queue, and the facts its blockers are decided on (`core/blockers.py`)
- `allocations`: allocations and their release, pending reasons, preemptions, spares
- `history`: finished jobs' runtimes, for runtime prediction (`core/predict.py`)

The placer writes `placer_lease`, `allocations*`, `pending_reasons`, `placer_cycles` and
`preemptions`; it reads the other services' tables to build its snapshot.
"""

from services.placer.repo.allocations import (
    PRUNE_CYCLES,
    LiveAllocation,
    insert_allocation,
    live_allocation,
    record_cycle,
    record_preemption,
    release_dropped_nodes,
    release_finished,
    swap_nodes,
    withdraw_allocation,
    write_predictions,
    write_waits,
)
from services.placer.repo.history import HISTORY, load_outcomes, outcomes_of
from services.placer.repo.lease import acquire_lease, lock_lease, release_lease, renew_lease
from services.placer.repo.pending import (
    PendingJob,
    changed_since,
    load_blocker_facts,
    load_pending,
    load_up_since,
)
from services.placer.repo.snapshot import (
    load_kept,
    load_limits,
    load_nodes,
    load_priorities,
    load_reservations,
    load_running,
)

__all__ = [
    "HISTORY",
    "PRUNE_CYCLES",
    "LiveAllocation",
    "PendingJob",
    "acquire_lease",
    "changed_since",
    "insert_allocation",
    "live_allocation",
    "load_blocker_facts",
    "load_kept",
    "load_limits",
    "load_nodes",
    "load_outcomes",
    "load_pending",
    "load_priorities",
    "load_reservations",
    "load_running",
    "load_up_since",
    "lock_lease",
    "outcomes_of",
    "record_cycle",
    "record_preemption",
    "release_dropped_nodes",
    "release_finished",
    "release_lease",
    "renew_lease",
    "swap_nodes",
    "withdraw_allocation",
    "write_predictions",
    "write_waits",
]
