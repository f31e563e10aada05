"""Contracts: every event on the bus, as one versioned tagged union.

Tags are past-tense facts; the subject is `muster.` + tag. Events evolve by adding
fields with defaults; a tag is never renamed, retyped or reused. One encoder and one
decoder live here; `tests/wire/` keeps one recorded payload per tag, every field filled
(`tests/unit/test_wire.py` decodes and re-encodes each). State fields stay `str` on the
wire and hold `shared.states` values.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec

from shared.signal_scope import SignalScope

SUBJECT_PREFIX = "muster."


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    event_id: uuid.UUID = msgspec.field(default_factory=uuid.uuid4)
    occurred_at: datetime = msgspec.field(default_factory=lambda: datetime.now(UTC))
    version: int = 1


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    gpus: tuple[int, ...] = ()


# --- jobs ---------------------------------------------------------------------------


class JobSubmitted(Event, frozen=True, tag="job.submitted"):
    job_id: int
    user: str
    account: str
    partition: str = "normal"


class JobCancelRequested(Event, frozen=True, tag="job.cancel_requested"):
    job_id: int
    by: str
    reason: str = "cancelled by user"
    signal: str | None = None
    # With `signal`: what it reaches (None: the job's work, its steps for an sbatch job)
    signal_scope: SignalScope | None = None
    exit_code: int | None = None  # see JobSelector.exit_code


class JobLimitChanged(Event, frozen=True, tag="job.limit_changed"):
    """`muster update --time` / `scontrol update TimeLimit=` of a job that has started:
    its coordinator reads its timers again (the limit counts from the run's start)."""

    job_id: int
    time_limit_s: int
    by: str


class JobRequeueRequested(Event, frozen=True, tag="job.requeue_requested"):
    """`muster requeue` / `scontrol requeue`: stop the running job and put it back in
    the queue, same id, restart_count + 1 (admission checked who asks)."""

    job_id: int
    by: str
    reason: str = "requeued by user"


class JobAllocated(Event, frozen=True, tag="job.allocated"):
    job_id: int
    attempt: int
    alloc_id: int
    grants: tuple[Grant, ...]
    epoch: int
    backfilled: bool = False


class JobStarted(Event, frozen=True, tag="job.started"):
    job_id: int
    attempt: int
    nodes: tuple[str, ...]
    world_size: int


class JobPreemptRequested(Event, frozen=True, tag="job.preempt_requested"):
    job_id: int
    for_job_id: int
    grace_s: int
    epoch: int


class JobFinished(Event, frozen=True, tag="job.finished"):
    """A job reached a terminal state (or an attempt ended for good)."""

    job_id: int
    attempt: int
    state: str  # a shared.states.TERMINAL value
    user: str
    account: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    gpu_seconds: float = 0.0
    gpu_model: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None


class JobRequeued(Event, frozen=True, tag="job.requeued"):
    job_id: int
    attempt: int
    reason: str
    excluded_nodes: tuple[str, ...] = ()
    restart_count: int = 0
    gpu_seconds: float = 0.0
    user: str = ""
    account: str = ""


class JobReconfigured(Event, frozen=True, tag="job.reconfigured"):
    """An elastic job shrank (or grew): its allocation keeps only `grants`."""

    job_id: int
    attempt: int
    grants: tuple[Grant, ...]
    dropped_nodes: tuple[str, ...]
    world_size: int
    reason: str


class JobSparesRequested(Event, frozen=True, tag="job.spares_requested"):
    """A fixed-size job lost nodes: it keeps `keep` and asks for `count` more nearby."""

    job_id: int
    attempt: int
    count: int
    keep: tuple[str, ...]
    exclude: tuple[str, ...] = ()


class JobSparesAnswered(Event, frozen=True, tag="job.spares_answered"):
    """The placer's answer: the spares added to the job's allocation, or none."""

    job_id: int
    attempt: int
    grants: tuple[Grant, ...] = ()
    reason: str = ""


class UsageTicked(Event, frozen=True, tag="usage.ticked"):
    """Cumulative GPU-seconds of one attempt so far; charging takes the difference."""

    job_id: int
    attempt: int
    user: str
    account: str
    gpu_model: str
    gpu_seconds_total: float


# --- nodes --------------------------------------------------------------------------


class GpuSlot(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    uuid: str = ""
    pci: str = ""
    model: str = "SIM-H100"
    memory_mib: int = 0
    locality: int = 0


class NodeRegistered(Event, frozen=True, tag="node.registered"):
    node: str
    address: str
    gpus: tuple[GpuSlot, ...]
    topology: tuple[str, ...] = ()
    features: tuple[str, ...] = ()  # from its topology file, as Slurm's Features=
    boot_id: str = ""
    # The node's CPUs and memory (its machine's, or its settings'); 0: not said
    cpus: int = 0
    memory_mib: int = 0
    # The probe's health check at (re)registration; None from probes that run none.
    check_passed: bool | None = None
    check_problems: tuple[str, ...] = ()
    unhealthy_gpus: tuple[int, ...] = ()
    reset_pending: tuple[int, ...] = ()  # healthy GPUs a reset would remap rows on
    # The job workers the node's agent still runs (re-adopted after its own restart):
    # the launcher stops any whose attempt has ended, then emits `node.cleaned`.
    running: tuple[RunningWorker, ...] = ()


class RunningWorker(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    attempt: int
    generation: int


class NodeCleaned(Event, frozen=True, tag="node.cleaned"):
    """The launcher stopped every worker of an ended attempt a registering node reported
    (or found none): the node may return to service for boot `boot_id`."""

    node: str
    boot_id: str = ""
    stopped: tuple[RunningWorker, ...] = ()


class GpuXidObserved(Event, frozen=True, tag="gpu.xid_observed"):
    """The node probe saw an XID (from NVML or the kernel log), unclassified."""

    node: str
    gpu: int
    xid: int
    source: str = "nvml"
    pid: int | None = None
    recovery_action: int | None = None
    message: str = ""


class NodeFabricFaultObserved(Event, frozen=True, tag="node.fabric_fault_observed"):
    """The node probe saw a fabric link fault (or its end), unclassified: `condition` is
    a `fabric_core.FabricCondition`; `source` is sysfs or the site hook."""

    node: str
    link: str
    condition: str
    detail: str = ""
    cleared: bool = False
    source: str = "sysfs"
    faulted: tuple[str, ...] = ()  # the node's links still at fault after this report


class NodeFault(Event, frozen=True, tag="node.fault"):
    node: str
    gpu: int | None
    xid: int | None
    fault_class: str
    action: str
    severity: str = "critical"
    excludes_node: bool = True
    affects_job: bool = True
    job_id: int | None = None
    link: str = ""  # a fabric fault: the link that failed ("mlx5_0/1", "ib0")


class NodeDown(Event, frozen=True, tag="node.down"):
    node: str
    reason: str


class NodeRecovered(Event, frozen=True, tag="node.recovered"):
    node: str
    reason: str = ""


class NodeDrainRequested(Event, frozen=True, tag="node.drain_requested"):
    node: str
    by: str
    reason: str
    resume: bool = False


class NodeHookFailed(Event, frozen=True, tag="node.hook_failed"):
    """A site hook (Prolog, Epilog) failed on `node`: its agent asks for the node's
    drain, as Slurm does; the health monitor drains it with `reason`."""

    node: str
    hook: str  # prolog | epilog
    reason: str


class WorkerExited(Event, frozen=True, tag="worker.exited"):
    job_id: int
    attempt: int
    node: str
    exit_code: int | None
    signal: int | None = None
    oom_killed: bool = False
    generation: int = 0
    spawn_failed: str = ""
    mem_peak_bytes: int | None = None  # the job cgroup's memory peak on this node
    cpu_usec: int | None = None  # and the CPU time it used there (sacct's TotalCPU)
    # its stepd ended without recording the exit (the node crashed or rebooted, or stepd
    # was killed): the node failed the worker, not the job itself
    lost: bool = False
    # stopped by its node's fence (the node lost the control plane past fence_s): also
    # the node's failure, not the job's
    fenced: bool = False


class JobNodeLost(Event, frozen=True, tag="job.node_lost"):
    """A node failed the job other than under its own worker: a task of one of the job's
    steps (srun) there was fenced (the node lost the control plane) or lost with the
    node. Published by the launcher with the step's end, before srun hears of it; the
    job's coordinator handles it as a node fault (restart or requeue, not excluded), as
    Slurm ends a job NODE_FAIL. Otherwise the batch script, told by srun that its step
    failed, would exit non-zero on a healthy node and FAIL the job."""

    job_id: int
    attempt: int
    generation: int
    node: str
    step_id: int
    reason: str


AnyEvent = (
    JobSubmitted
    | JobCancelRequested
    | JobLimitChanged
    | JobRequeueRequested
    | JobAllocated
    | JobStarted
    | JobPreemptRequested
    | JobFinished
    | JobRequeued
    | JobReconfigured
    | JobSparesRequested
    | JobSparesAnswered
    | JobNodeLost
    | UsageTicked
    | NodeRegistered
    | NodeCleaned
    | GpuXidObserved
    | NodeFabricFaultObserved
    | NodeFault
    | NodeDown
    | NodeRecovered
    | NodeDrainRequested
    | NodeHookFailed
    | WorkerExited
)

ENCODER = msgspec.json.Encoder()
DECODER: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def tag_of(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


# The events a node agent (or its probe) publishes. Their subject ends with the node
# they are about, `muster.<tag>.<node>` (`muster.gpu.xid_observed.node01`), so the bus
# lets each agent publish its own node's alone (shared/bus_auth.py) and every consumer
# refuses one whose payload names another node (`node_mismatch`; docs/security.md).
NODE_SUBJECT_TAGS = (
    "node.registered",
    "gpu.xid_observed",
    "node.fabric_fault_observed",
    "worker.exited",
    "node.hook_failed",
)


def subject_of(event: Event) -> str:
    tag = tag_of(event)
    if tag in NODE_SUBJECT_TAGS:
        return node_subject(tag, _node_of(event))
    return SUBJECT_PREFIX + tag


def _node_of(event: Event) -> str:
    node = getattr(event, "node", None)
    assert isinstance(node, str), f"{tag_of(event)} names no node"
    return node


def node_subject(tag: str, node: str) -> str:
    """The subject of node event `tag` about `node`: `muster.<tag>.<node>`."""
    return f"{SUBJECT_PREFIX}{tag}.{node}"


def node_filter(tag: str) -> str:
    """The filter subject of node event `tag`, every node's: `muster.<tag>.>`."""
    return f"{SUBJECT_PREFIX}{tag}.>"


def node_mismatch(subject: str, event: Event) -> str | None:
    """Why `event`, received on `subject`, must be refused; None when it may be handled.

    A node event must arrive on its own node's subject: one whose payload names another
    node (or that came on a subject without a node) was forged or misrouted."""
    tag = tag_of(event)
    if tag not in NODE_SUBJECT_TAGS:
        return None
    node = _node_of(event)
    prefix = f"{SUBJECT_PREFIX}{tag}."
    on = subject.removeprefix(prefix) if subject.startswith(prefix) else ""
    if on == node:
        return None
    return f"node mismatch: {tag} about node {node!r} on the subject of node {on!r}"


def encode(event: Event) -> bytes:
    return ENCODER.encode(event)


def decode(payload: bytes) -> AnyEvent:
    return DECODER.decode(payload)
