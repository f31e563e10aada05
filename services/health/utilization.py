"""Pure core: what each GPU of the cluster was doing, tallied as GPU-seconds by the hour
(`cluster_hours`, migration 0028), for `muster report --cluster` and sreport's `cluster
Utilization`.

The health monitor's liveness pass (one a second, by the lease holder alone) adds the
time since its previous pass to each GPU's state as that pass loaded it:

- ALLOCATED: held by a live allocation (whatever its health: the job has it);
- IDLE: on an UP node, healthy, held by none;
- PLANNED_DOWN: held by none on a node an operator drained (`muster drain`; DRAINING or
  DRAINED): maintenance, what Slurm's report calls PLND Down;
- DOWN: every other GPU held by none: its node DOWN, FAILED, SUSPECT (silent),
  CLEANING, or drained by the health monitor for a fault, or the GPU itself unhealthy.

A pass's time that crosses an hour's start is shared between the two hours
(`hours_of`). A gap between two passes longer than `MAX_TALLY_S` (the monitor paused,
PostgreSQL away, the lease changing hands) counts only that much: what the GPUs did in
the rest of it is not known, and the report's `Reported` total says how much was
counted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.health.monitor_model import NodeHealth
from shared.states import GpuTime, NodeState

MAX_TALLY_S = 10.0  # the most one pass counts: a longer gap is not known
HOUR_S = 3600.0
DRAINED = frozenset({NodeState.DRAINING, NodeState.DRAINED})


def gpu_time(node: NodeHealth, healthy: bool, allocated: bool) -> GpuTime:
    """One GPU's state, as the list above says."""
    if allocated:
        return GpuTime.ALLOCATED
    if node.state is NodeState.UP and healthy:
        return GpuTime.IDLE
    if node.state in DRAINED and node.operator_drain and healthy:
        return GpuTime.PLANNED_DOWN
    return GpuTime.DOWN


def tally(
    nodes: Iterable[NodeHealth], allocated: Mapping[str, frozenset[int]], seconds: float
) -> dict[GpuTime, float]:
    """GPU-seconds per state over `seconds` (only states some GPU is in)."""
    out: dict[GpuTime, float] = {}
    for node in nodes:
        held = allocated.get(node.name, frozenset())
        for g in node.gpus:
            state = gpu_time(node, g.healthy, g.index in held)
            out[state] = out.get(state, 0.0) + seconds
    return out


def counted_s(now: float, last: float | None) -> float:
    """The time one pass counts: since the previous pass, at most `MAX_TALLY_S`; none
    for the first pass of a holder (or a clock that went back)."""
    if last is None or now <= last:
        return 0.0
    return min(now - last, MAX_TALLY_S)


def hour_of(epoch: float) -> float:
    return epoch // HOUR_S * HOUR_S


def hours_of(now: float, seconds: float) -> list[tuple[float, float]]:
    """The counted span, the `seconds` up to `now`, by the hours it falls in: (hour,
    seconds of the span in it). One hour, or two when the span crosses an hour's start
    (a span is at most `MAX_TALLY_S`), so each hour gets its own share."""
    start, boundary = now - seconds, hour_of(now)
    if start >= boundary:
        return [(boundary, seconds)] if seconds > 0 else []
    parts = [(hour_of(start), boundary - start), (boundary, now - boundary)]
    return [(hour, part) for hour, part in parts if part > 0]
