"""Contracts: the one name of every job, run and node state, and which of them are final.

Every service compares and writes these states; spelled as bare strings they drifted
(a typo is a state nobody handles). Each is a `StrEnum`, so a member *is* its string:
it compares equal to what the database and the events hold, and events keep their `str`
fields. `shared/migrations/0008_states.sql` holds the same sets as CHECK constraints,
so a misspelt state fails at the write; `tests/service/test_states.py` proves the two
agree.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """A job's state as `muster queue` shows it (Slurm's names)."""

    PENDING = "PENDING"  # waiting to be placed (held, dependent, or no room yet)
    CONFIGURING = "CONFIGURING"  # allocated; the launcher has not started workers yet
    STARTING = "STARTING"  # the launcher is starting a generation on every node
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"  # workers are being stopped; ends in `job_runs.stopping_to`
    REQUEUED = "REQUEUED"  # handed back to the queue (fault, preemption): pending again
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"


# States a job never leaves. A REQUEUED job is pending again, so it is not here.
TERMINAL: frozenset[JobState] = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.NODE_FAIL,
        JobState.OUT_OF_MEMORY,
        JobState.PREEMPTED,
    }
)

# A run (the launcher's `job_runs` row) whose workers are, or may be, on the machines.
LIVE_RUN: frozenset[JobState] = frozenset(
    {JobState.STARTING, JobState.RUNNING, JobState.COMPLETING}
)

# A job that has not ended, as the views show it (a REQUEUED run shows PENDING): what
# `muster queue` lists by default and what a cancel or hold can still act on.
ACTIVE: frozenset[JobState] = frozenset({JobState.PENDING, JobState.CONFIGURING}) | LIVE_RUN

# Every state a `job_runs` row may hold; PENDING and CONFIGURING are derived by the
# views (no run row yet, or an allocation without one), never stored.
RUN_STATES: frozenset[JobState] = LIVE_RUN | {JobState.REQUEUED} | TERMINAL

# What a COMPLETING run ends in once its workers are stopped (`job_runs.stopping_to`).
STOPPING_TO: frozenset[JobState] = TERMINAL | {JobState.REQUEUED}


class NodeState(StrEnum):
    """A node's state (`nodes.state`), written by the health monitor, read by all."""

    UP = "UP"
    SUSPECT = "SUSPECT"  # silent for heartbeat_timeout_s: nothing new placed, jobs kept
    CLEANING = "CLEANING"  # re-registered with workers running: out until node.cleaned
    DRAINING = "DRAINING"  # running work finishes, nothing new is placed
    DRAINED = "DRAINED"
    DOWN = "DOWN"  # silent for down_after_s: its jobs are restarted elsewhere
    FAILED = "FAILED"  # a hardware fault: excluded until a check passes


class GpuTime(StrEnum):
    """What a GPU's time is counted as by the hour (`cluster_hours.state`, written by the
    health monitor: services/health/utilization.py; `muster report --cluster`)."""

    ALLOCATED = "ALLOCATED"  # held by a live allocation
    IDLE = "IDLE"  # healthy on an UP node, held by none
    PLANNED_DOWN = "PLANNED_DOWN"  # held by none on a node an operator drained
    DOWN = "DOWN"  # held by none, its node down or silent or its GPU unhealthy
