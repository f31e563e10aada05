"""Pure core, data: the placer's input (a Snapshot and JobRequests) and output (a Plan).

Every type is a frozen msgspec Struct so a snapshot can be recorded as JSON, replayed in
the simulator, and compared whole in tests. Times are float epoch seconds; durations are
integer seconds. New fields are added with defaults, never renamed or retyped.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from shared.states import NodeState  # only UP nodes get new work


class Gpu(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str = "sim"
    memory_mib: int = 0
    locality: int = 0  # NVLink/NUMA group inside the node: GPUs sharing it talk fastest
    healthy: bool = True


class Node(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    gpus: tuple[Gpu, ...]
    state: NodeState = NodeState.UP
    topology: tuple[str, ...] = ()  # switch path root -> leaf, e.g. ("spine0", "leaf3")
    block: str | None = None  # NVLink domain spanning nodes (Slurm topology/block)
    partitions: tuple[str, ...] = ()  # empty: the node serves every partition
    features: tuple[str, ...] = ()  # what --constraint matches (topology file, config)
    gpu_type: str | None = None  # configured short type; None: derived from the GPU model
    # Why a fabric fault keeps the node out of multi-node jobs ("" : it is not): its
    # links carry collectives badly (errors rising, speed degraded), single-node work
    # is unaffected. See `fabric.spans_nodes`.
    multi_node_excluded: str = ""
    # Its size as its agent announced it (shared.node_size): a job goes only where its
    # CPUs and --mem per node fit; 0: not known, every job fits.
    cpus: int = 0
    memory_mib: int = 0


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    gpus: tuple[int, ...]  # Gpu.index values on that node


class Running(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    user: str
    account: str
    partition: str = "normal"
    qos: str = "normal"
    tier: int = 0
    priority: float = 0
    preemptible: bool = True
    started_at: float
    time_limit_s: int
    min_runtime_s: int = 0  # not preempted before it has run this long
    grace_s: int = 0  # time between the preemption signal and the kill
    grants: tuple[Grant, ...]
    exclusive: bool = False  # holds its nodes whole, whatever GPUs it uses
    preempted_by: int | None = None  # already being preempted for this job (in its grace)
    predicted_s: int | None = None  # expected runtime (predict.py): plans, never kills
    name: str = ""  # the job's name (what its runtime is predicted from)
    mem_per_node_mib: int = 0  # its --mem, held on each of its nodes (memory.py)
    mem_whole: bool = False  # --mem=0: all of each node's memory


class JobRequest(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    user: str
    account: str = "default"
    partition: str = "normal"
    qos: str = "normal"
    tier: int = 0
    priority: float = 0.0
    submitted_at: float
    nodes_min: int = 1
    nodes_max: int = 1
    gpus_per_node: int = 0
    gpus_total: int | None = None  # the core lays these out over as few nodes as it can
    gpu_model: str | None = None  # a GPU type ("h100") or model, any case
    constraint: str | None = None  # --constraint (shared.constraint): nodes it admits
    exclusive: bool = False
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    # What it asks of each node besides GPUs (shared.node_size.per_node): CPUs and --mem
    cpus_per_node: int = 1
    mem_per_node_mib: int = 0
    mem_whole: bool = False  # --mem=0: all of each node's memory (memory.py)
    time_limit_s: int = 3600
    max_switches: int | None = None  # at most this many leaf switches (Slurm --switches=K)
    switches_wait_s: int = 0  # ... until this long after submitted_at, then any (the @T)
    preemptible: bool = True
    can_preempt: bool = False
    held: bool = False
    blocked_by: Blocker | None = None  # begin time, dependency, array throttle (blockers.py)
    grace_s: int = 0  # grace this job gets if it is itself preempted later
    min_runtime_s: int = 0
    reservation: str | None = None  # run inside this advance reservation only
    requeued: bool = False  # back in the queue after a fault or preemption: head of its priority
    multi_node: bool = False  # one node of a gang of several (a spare, a grow): it needs
    # a node fit for multi-node work even when it asks for one
    name: str = ""  # the job's name: runtime predictions learn per user and name
    predicted_s: int | None = None  # expected runtime (predict.py): backfill and bookings
    # plan on it; the kill stays at time_limit_s


class Recurrence(StrEnum):
    NONE = "NONE"
    DAILY = "DAILY"
    WEEKLY = "WEEKLY"


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """An advance window on nodes (or on a GPU count) for some accounts, or maintenance."""

    name: str
    start: float
    duration_s: int
    nodes: tuple[str, ...] = ()  # empty with gpus == 0: the whole cluster
    gpus: int = 0  # a GPU count instead of named nodes: whole nodes are set aside for it
    accounts: tuple[str, ...] = ()  # who may run inside; empty: nobody (maintenance)
    recurrence: Recurrence = Recurrence.NONE
    maintenance: bool = False


class Limit(msgspec.Struct, frozen=True, kw_only=True):
    max_gpus: int | None = None  # GPUs held by running jobs
    max_jobs: int | None = None  # jobs running


class QosLimit(msgspec.Struct, frozen=True, kw_only=True):
    max_gpus: int | None = None  # whole QOS
    max_jobs: int | None = None
    max_gpus_per_user: int | None = None
    max_jobs_per_user: int | None = None
    max_gpus_per_account: int | None = None  # each account's jobs under this QOS
    max_jobs_per_account: int | None = None


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Dynamic caps on running work; a key missing from a dict has no cap."""

    user_default: Limit = Limit()
    users: dict[str, Limit] = {}
    accounts: dict[str, Limit] = {}
    qos: dict[str, QosLimit] = {}


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[Node, ...]
    running: tuple[Running, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    limits: Limits = Limits()


class PolicyConfig(msgspec.Struct, frozen=True, kw_only=True):
    backfill: bool = True
    reservation_depth: int = 16  # highest-priority blocked jobs that get a reserved start
    max_job_test: int = 5000  # jobs tried per pass beyond which the rest just wait (Slurm
    # bf_max_job_test); they are still given a Wait
    strict_order: bool = False  # FIFO: nothing starts behind the first blocked job
    preemption: bool = True
    max_preemptors: int = 32  # jobs per pass that may search for victims
    max_switch_wait_s: int = 300  # --switches=K without @T waits this long (as Slurm)
    booking_window_s: int = 86_400  # bookings further ahead are estimates only, hold
    # nothing (Slurm bf_window): far-off promises would idle GPUs for days
    use_predictions: bool = True  # plan on predicted runtimes where jobs carry one
    # (predict.py); off: on the users' limits, as textbook EASY does
    service_weight: float = 0.0  # within a tier, priority - this x log2(1 + predicted
    # GPU-hours): small jobs first inside each account's fair share (see order.py)
    max_wait_s: float | None = None  # a job waiting this long goes ahead of every
    # younger one of its tier, oldest first: nothing waits unboundedly behind small jobs
    order_trust: float = 1.0  # how far the service term trusts a prediction over the
    # job's own limit: it counts predicted^t x limit^(1-t) seconds (1: the prediction, 0:
    # the limit). Planning (backfill, bookings) always uses the prediction itself
    age_weight: float = 0.0  # score gained per hour waited (linear, uncapped): a wide or
    # long job climbs past the small ones at this rate instead of all at once at max_wait_s
    pack_small: bool = False  # a one-node job goes to the node with the fewest free GPUs
    # that hold it anywhere, and of those in the leaf with the fewest whole free nodes
    # (select.py: the fragmentation score), so leaves stay whole for gangs
    age_ref_gpus: int = 0  # with max_wait_s: a job of more GPUs than this reaches the
    # bound sooner, max_wait_s x age_ref_gpus / its GPUs (an age term growing with size)
    protect_oldest: bool = False  # the oldest job of the pass's top tier and priority is
    # tried first (so it gets the first booking, as EASY's queue head does); the score
    # orders the rest: no job waits much longer than it would at the head of a FIFO
    gang_leaf_wait_s: float = 0.0  # a multi-node gang about to spread over leaf switches,
    # that one leaf could hold, waits (TOPOLOGY, booked there) if a leaf holds it within
    # this long from now on the planned ends


class Waiting(StrEnum):
    PRIORITY = "PRIORITY"  # resources are free but a higher-priority job holds them
    RESOURCES = "RESOURCES"
    TOPOLOGY = "TOPOLOGY"  # would fit, but not within max_switches yet
    RESERVATION = "RESERVATION"  # would run into an advance reservation or maintenance
    NODES_EXCLUDED = "NODES_EXCLUDED"  # required nodes unusable, or too few left
    HELD = "HELD"
    BEGIN_TIME = "BEGIN_TIME"  # its --begin time has not come (Slurm BeginTime)
    DEPENDENCY = "DEPENDENCY"  # a job it depends on has not got there yet
    DEPENDENCY_NEVER_SATISFIED = "DEPENDENCY_NEVER_SATISFIED"  # and never will
    SINGLETON = "SINGLETON"  # an earlier job of its user and name is still live
    JOB_ARRAY_TASK_LIMIT = "JOB_ARRAY_TASK_LIMIT"  # its array's %K tasks already run
    PREEMPTING = "PREEMPTING"  # victims were signalled; starts once they are gone
    USER_MAX_GPUS = "USER_MAX_GPUS"
    USER_MAX_JOBS = "USER_MAX_JOBS"
    ACCOUNT_MAX_GPUS = "ACCOUNT_MAX_GPUS"
    ACCOUNT_MAX_JOBS = "ACCOUNT_MAX_JOBS"
    QOS_MAX_GPUS = "QOS_MAX_GPUS"
    QOS_MAX_JOBS = "QOS_MAX_JOBS"
    QOS_MAX_GPUS_PER_USER = "QOS_MAX_GPUS_PER_USER"
    QOS_MAX_JOBS_PER_USER = "QOS_MAX_JOBS_PER_USER"
    QOS_MAX_GPUS_PER_ACCOUNT = "QOS_MAX_GPUS_PER_ACCOUNT"
    QOS_MAX_JOBS_PER_ACCOUNT = "QOS_MAX_JOBS_PER_ACCOUNT"
    PARTITION_DOWN = "PARTITION_DOWN"
    BAD_CONSTRAINTS = "BAD_CONSTRAINTS"  # no node could ever run it as asked
    NOT_TESTED = "NOT_TESTED"  # beyond max_job_test this pass


class Blocker(msgspec.Struct, frozen=True, kw_only=True):
    """What holds a job back before resources are looked at (see blockers.py)."""

    reason: Waiting
    detail: str = ""


class Fit(StrEnum):
    """Where a gang was put, best first (see select.py)."""

    NODE = "NODE"  # one node, best fit, its GPUs in one locality group
    NODE_SPLIT = "NODE_SPLIT"  # one node, GPUs over several locality groups
    BLOCK = "BLOCK"  # inside the tightest NVLink block that holds it (`domain`)
    SWITCH = "SWITCH"  # inside the tightest switch that holds it (`domain`)
    ACROSS_SWITCHES = "ACROSS_SWITCHES"  # no single switch holds it
    FLAT = "FLAT"  # no topology known: nodes with the fewest spare GPUs first


class Backfill(StrEnum):
    NO = "NO"  # nothing of higher order waits
    BEFORE_RESERVED_START = "BEFORE_RESERVED_START"  # on GPUs booked for `around`, which
    # it gives back before that job's reserved start
    ON_UNRESERVED_GPUS = "ON_UNRESERVED_GPUS"  # on GPUs no booking needs; `around` waits


class Start(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    grants: tuple[Grant, ...]
    backfilled: bool = False
    fit: Fit = Fit.NODE
    domain: str = ""  # the block or switch of a BLOCK or SWITCH fit
    backfill: Backfill = Backfill.NO
    around: int | None = None  # the waiting job a backfill went around


def describe(start: Start) -> str:
    """A start's placement in words, for logs and the spares answer."""
    n = len(start.grants)
    node = start.grants[0].node if start.grants else ""
    text = {
        Fit.NODE: f"best fit on node {node}, GPUs in one locality group",
        Fit.NODE_SPLIT: f"best fit on node {node}, GPUs over several locality groups",
        Fit.BLOCK: f"{n} nodes inside block {start.domain}, tightest that holds the gang",
        Fit.SWITCH: f"{n} nodes inside switch {start.domain}, tightest that holds the gang",
        Fit.ACROSS_SWITCHES: f"{n} nodes across leaf switches (no single switch holds it)",
        Fit.FLAT: f"{n} nodes, fewest spare GPUs first (no topology known)",
    }[start.fit]
    if start.backfill is Backfill.BEFORE_RESERVED_START:
        text += f"; backfilled, ends before the reserved start of job {start.around}"
    elif start.backfill is Backfill.ON_UNRESERVED_GPUS:
        text += f"; backfilled on GPUs no reservation needs (job {start.around} waits)"
    return text


class Preempt(msgspec.Struct, frozen=True, kw_only=True):
    victim_job_id: int
    for_job_id: int
    grace_s: int


class Wait(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    reason: Waiting
    detail: str = ""
    estimated_start: float | None = None


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    waits: tuple[Wait, ...] = ()


# The placer's own policy (the service's default and the simulator's `muster`): the
# mechanism defaults above plus shortest-predicted-service-first with an age bound.
# the placer's default (docs/sim-report.md measures it): shortest predicted service first
# inside fair share, the prediction hedged by the job's own limit (their geometric mean:
# a history that says "minutes" cannot alone put a job that asks for days in front); a
# linear age term of 0.5 an hour (a 64-GPU job of 2 hours passes a fresh 1-GPU job of 10
# minutes and equal priority after 136 hours); a 7-day hard bound behind it (Slurm's
# PriorityMaxAge); one-node jobs packed by the fragmentation score
MUSTER_POLICY = PolicyConfig(
    service_weight=10.0,
    order_trust=0.5,
    age_weight=0.5,
    max_wait_s=7 * 86_400,
    pack_small=True,
)
