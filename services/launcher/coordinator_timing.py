"""Pure core, clock arithmetic: when a run's timers fall due and which one is due now.

No clock of its own: every `now` is the caller's, read once per transaction.
"""

from __future__ import annotations

import signal as _signal

from services.launcher.coordinator_model import (
    SPARE_WAIT_S,
    AnyObservation,
    CoordinatorConfig,
    JobRun,
    Phase,
    Rearm,
    SettleElapsed,
    SignalDue,
    SparesDenied,
    TimeLimitReached,
    Timers,
)
from shared.jobspec import JobSpec


def start_run(
    spec: JobSpec, *, job_id: int, nodes: tuple[str, ...], now: float, generation: int = 0,
    restart_count: int = 0, excluded_nodes: tuple[str, ...] = (),
) -> JobRun:  # fmt: skip
    """The state of a job whose first (or requeued) allocation starts now on `nodes`."""
    return JobRun(
        job_id=job_id, spec=spec, generation=generation, nodes=nodes, started_at=now,
        limit_from=now, restart_count=restart_count, excluded_nodes=excluded_nodes,
    )  # fmt: skip


def timers(run: JobRun) -> Timers:
    limit_at = run.limit_from + run.spec.time_limit_s
    wants_signal = run.spec.signal is not None and not run.signal_sent
    signal_at = limit_at - run.spec.signal_before_s if wants_signal else None
    failure = run.pending_failure
    settle_at = failure.settle_at if failure and run.phase is Phase.SETTLING else None
    asked = run.spare_asked_at if run.phase is Phase.AWAITING_SPARE else None
    spare_deadline = None if asked is None else asked + SPARE_WAIT_S
    return Timers(
        signal_at=signal_at, limit_at=limit_at, settle_at=settle_at, spare_deadline=spare_deadline
    )


def due_observation(run: JobRun, now: float) -> AnyObservation | None:
    """The timer of `run` that is due at `now`, the most consequential first."""
    t = timers(run)
    if t.spare_deadline is not None and t.spare_deadline <= now:
        return SparesDenied()
    if t.settle_at is not None and t.settle_at <= now:
        return SettleElapsed()
    if t.limit_at <= now:
        return TimeLimitReached()
    if t.signal_at is not None and t.signal_at <= now:
        return SignalDue()
    return None


def due_or_rearm(run: JobRun, now: float) -> AnyObservation:
    """A timer's observation: what is due at `now`, or, when the limit was changed since
    the due time was written and nothing is, `Rearm` (the due time written again)."""
    return due_observation(run, now) or Rearm()


def due_at(run: JobRun) -> float | None:
    """When the shell must next wake for `run` (None: never, it has ended)."""
    if run.phase is Phase.ENDED:
        return None
    t = timers(run)
    if run.phase is Phase.AWAITING_SPARE:
        return t.spare_deadline
    signal_at = t.signal_at if parse_signal(run.spec.signal or "") is not None else None
    return min(x for x in (signal_at, t.limit_at, t.settle_at) if x is not None)


def parse_signal(name: str) -> int | None:
    """`USR1`, `SIGUSR1` or `10` -> 10; None for what is not a signal."""
    text = name.strip().upper()
    if text.isdigit():
        return int(text)
    try:
        return int(_signal.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except KeyError:
        return None


def world_size(spec: JobSpec, nnodes: int) -> int:
    """Worker processes of a generation on `nnodes` nodes in the job's launch mode."""
    if not spec.torchrun:
        return nnodes
    return nnodes * (spec.gpus_per_node or spec.ntasks_per_node)


def backoff_s(fault_restarts: int, config: CoordinatorConfig) -> float:
    """Delay before fault restart number `fault_restarts` + 1: 0, base, 2*base, ..."""
    if fault_restarts == 0:
        return 0.0
    return float(min(config.backoff_max_s, config.backoff_base_s * 2 ** (fault_restarts - 1)))
