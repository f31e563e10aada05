"""Pure: what the coordinator's shell feeds the core: an event (or a timer) as the
observation `coordinator_core.decide` takes, the core's stored state of a run, and
the shell's time conversions."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import msgspec

from services.launcher import coordinator_core as core
from services.launcher import repo
from services.launcher.exitstatus import ExitStatus
from shared.events import JobNodeLost, JobSparesAnswered, NodeDown, NodeFault, WorkerExited
from shared.jobspec import JobSpec

Choose = Callable[[core.JobRun, float], core.AnyObservation | None]
_CORE_DECODER = msgspec.json.Decoder(core.JobRun)


def always(obs: core.AnyObservation) -> Choose:
    return lambda _run, _now: obs


def exited(ev: WorkerExited) -> core.AnyObservation:
    status = ExitStatus(
        exit_code=ev.exit_code,
        signal=ev.signal,
        oom_killed=ev.oom_killed,
        mem_peak_bytes=ev.mem_peak_bytes,
    )
    return core.WorkerExited(
        node=ev.node,
        generation=ev.generation,
        status=status,
        spawn_failed=ev.spawn_failed,
        lost=ev.lost,
        fenced=ev.fenced,
    )


def step_lost(ev: JobNodeLost) -> core.AnyObservation:
    return core.StepNodeLost(node=ev.node, generation=ev.generation, reason=ev.reason)


def lost(ev: NodeFault | NodeDown) -> core.AnyObservation:
    if isinstance(ev, NodeFault):
        why = f"xid {ev.xid} ({ev.fault_class})" if ev.xid is not None else ev.fault_class
        why += f" on {ev.link}" if ev.link else ""  # a fabric fault names its link
        return core.NodeFault(node=ev.node, reason=why, excludes_node=ev.excludes_node)
    return core.NodeDown(node=ev.node, reason=ev.reason)


def answer(ev: JobSparesAnswered) -> Choose:
    """The placer's answer is spares for a job waiting on them, or room to grow back
    for a running elastic job."""
    nodes = tuple(g.node for g in ev.grants)

    def choose(run: core.JobRun, _now: float) -> core.AnyObservation:
        if run.phase is core.Phase.AWAITING_SPARE:
            return core.SparesGranted(nodes=nodes) if nodes else core.SparesDenied()
        return core.NodesAvailable(nodes=nodes)

    return choose


def load_core(run: repo.Run | None, spec: JobSpec) -> core.JobRun | None:
    if run is None or run.core is None:
        return None
    return msgspec.structs.replace(_CORE_DECODER.decode(run.core), spec=spec)


def at(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)
