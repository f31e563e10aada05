"""Contracts: the user-facing API, request-reply on NATS (`muster.api.<verb>`).

Admission serves these in a queue group, so replicas share the load. Every request is
signed (`shared.identity.SignedRequest` wraps its JSON) and the server takes the acting
user from the signing key; every reply is either its result or an `ApiError` whose
message says what to change.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from shared.signal_scope import SignalScope

API_PREFIX = "muster.api."
AGENT_PREFIX = "muster.agent."
HEARTBEAT_PREFIX = "muster.heartbeat."


class Request(msgspec.Struct, frozen=True, kw_only=True):
    # Kept for old clients: empty, or the user of the signing key (anything else is
    # refused as forged). The server sets it to the verified user before any handler.
    user: str = ""


class SubmitRequest(Request, frozen=True, kw_only=True):
    argv: tuple[str, ...] = ()  # options before the script, as typed
    script: str
    script_path: str = ""
    args: tuple[str, ...] = ()
    workdir: str = "/tmp"
    dry_run: bool = False
    # The submitter's environment as they submitted (sbatch's): what `--export` passes on
    # to the job, which never gets the daemons' own environment.
    environment: dict[str, str] = {}
    # Where a plain script runs when neither it nor `argv` says (`--batch-nodes`): the
    # sbatch shim asks for Slurm's, the first node only; `muster submit` for every node.
    batch_first_node: bool = False


class SubmitReply(msgspec.Struct, frozen=True, kw_only=True):
    job_ids: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    spec: dict[str, Any] | None = None  # what would be submitted (dry run)


class JobSelector(Request, frozen=True, kw_only=True):
    """Which jobs a cancel, hold, release or approve acts on; the filters combine (AND).

    `job_refs` are Slurm-style: `123` (a job, or every task of array 123), `123_4` (one
    array task), `123_[1-3,7]` (several). With `signal` a cancel only signals the running
    jobs it selects (scancel -s) and cancels nothing.
    """

    job_ids: tuple[int, ...] = ()
    name: str | None = None
    owner: str | None = None  # every job of this user
    # With `signal`: what it reaches (None: the job's work, its steps for an sbatch job)
    signal_scope: SignalScope | None = None
    mine: bool = False  # every job of the requester (`scancel --me`), as the key says
    signal: str | None = None
    # With a cancel: end a running job as if its script had exited so, COMPLETED for 0
    # and FAILED otherwise (salloc's release, and an srun that made its own allocation:
    # the job ends as its command did, as in Slurm); a job not running is cancelled.
    exit_code: int | None = None
    reason: str = ""
    job_refs: tuple[str, ...] = ()
    states: tuple[str, ...] = ()  # e.g. ("PENDING",): only jobs in these states
    partition: str | None = None
    hold: bool = False  # requeue: back in the queue held (scontrol requeuehold)


class UpdateRequest(Request, frozen=True, kw_only=True):
    """`muster update` / `scontrol update job`: change pending or running jobs in place
    (their id and place in the queue kept); None leaves a field as it is
    (services/admission/update.py says who may change what)."""

    job_refs: tuple[str, ...]  # as JobSelector's: 123, 123_4, 123_[1-3]
    time_limit_s: int | None = None
    time_limit_change_s: int | None = None  # `+30` / `-30`: added to each job's limit
    nice: int | None = None
    name: str | None = None
    comment: str | None = None
    # what the placer plans a pending job by (services/admission/replan.py)
    partition: str | None = None
    qos: str | None = None
    nodes: str | None = None  # N or MIN-MAX
    gpus_per_node: int | None = None
    exclude: str | None = None  # a hostlist; "" clears
    constraint: str | None = None  # "" clears
    begin: str | None = None  # as --begin takes it (now+1hour, 2026-12-08T10:00, now)
    dependency: str | None = None  # as --dependency takes it; "" clears
    nodelist: str | None = None  # a hostlist the job must run on; "" clears
    account: str | None = None
    # an array's `%K`: at most this many of its tasks run at once; 0 lifts it
    array_throttle: Annotated[int, msgspec.Meta(ge=0)] | None = None


class QueueRequest(Request, frozen=True, kw_only=True):
    users: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    all_states: bool = False
    job_ids: tuple[int, ...] = ()
    job_refs: tuple[str, ...] = ()  # as in JobSelector: 123, 123_4, 123_[1-3]
    accounts: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    steps: bool = False  # the selected jobs' running srun steps too (`squeue -s`)
    # The requester's own jobs as well as `users`' (`squeue --me`): whoever signed the
    # request, which a client without MUSTER_USER or $USER cannot name itself.
    mine: bool = False
    # Each pending job's unmet dependency in its view (`squeue -o %E`): one read more,
    # so only when asked.
    dependencies: bool = False
    # Each pending job's priority and its weighted factors, as fairshare last ranked it
    # (`sprio`): one read more, so only when asked.
    priorities: bool = False
    # A page of the selection (the gateway's dashboard at 10,000 jobs: the whole list
    # would not fit one NATS message): `limit` jobs from `offset`; 0: every job.
    offset: Annotated[int, msgspec.Meta(ge=0)] = 0
    limit: Annotated[int, msgspec.Meta(ge=0)] = 0


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `muster queue --json`; field names are stable."""

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    reason: str
    nodes: int
    gpus: int
    nodelist: tuple[str, ...]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    time_limit_s: int
    elapsed_s: float
    exit_code: int | None
    restart_count: int
    estimated_start: float | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_max_running: int | None = None  # an array task: its array's `%K`, if any
    detail: str = ""
    # a job waiting on its --dependency: it as given ("afterok:12:13"), with
    # QueueRequest.dependencies; else ""
    dependency: str = ""
    # a pending job's priority ("total") and its weighted factors (age, fairshare,
    # jobsize, partition, qos, nice), with QueueRequest.priorities; else {}
    priority: dict[str, float] = {}


class QueueReply(msgspec.Struct, frozen=True, kw_only=True):
    jobs: tuple[JobView, ...]
    # With a `limit`: the whole selection's size and counts (pending jobs by reason).
    total: int = 0
    by_state: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    steps: tuple[StepView, ...] = ()  # with `steps`: the jobs' RUNNING steps, by job and id


class ShowJobRequest(Request, frozen=True, kw_only=True):
    job_id: int


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    attempt: int
    seq: int
    nodes: tuple[str, ...]
    world_size: int
    reason: str
    outcome: str | None
    started_at: float
    ended_at: float | None


class ShowJobReply(msgspec.Struct, frozen=True, kw_only=True):
    job: JobView
    spec: dict[str, Any]
    attempts: tuple[AttemptView, ...] = ()
    why_pending: str = ""
    priority: dict[str, float] = {}
    dependency: str = ""  # the job's --dependency as given, e.g. "afterok:12:13"
    approval: str = ""  # "", "awaiting operator approval" or "approved by NAME"
    steps: tuple[StepView, ...] = ()  # the job's srun steps (docs/steps.md)
    # A running job's expected end from the placer's runtime prediction (never its kill,
    # which stays at the limit), and which history it comes from; None: no prediction.
    predicted_end: float | None = None
    predicted_why: str = ""
    # What its current attempt used, as its workers exited (their cgroups' counters):
    # the highest memory peak of one node and where, the CPU time of them all; None: none
    max_rss_bytes: int | None = None
    max_rss_node: str = ""
    cpu_usec: int | None = None


class GpuView(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    model: str
    healthy: bool
    allocated_to: int | None
    last_xid: int | None


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: str
    reason: str
    gpus_total: int
    gpus_free: int
    topology: tuple[str, ...]
    last_heartbeat: float | None
    last_fault: dict[str, Any] | None
    gpus: tuple[GpuView, ...] = ()
    features: tuple[str, ...] = ()  # what --constraint matches here
    gpu_type: str = ""  # the short GPU type --gres=gpu:TYPE:N names ("h100")
    partitions: tuple[str, ...] = ()  # the partitions it serves, in the config's order
    cpus: int = 0  # as its agent announced them; 0: not known
    memory_mib: int = 0
    state_since: float | None = None  # when it came into its state (sinfo -R's TIMESTAMP)
    cpus_alloc: int = 0  # the CPUs the jobs holding it asked of it (not counted out)
    mem_alloc_mib: int = 0  # the --mem its jobs hold of it (counted out: placer memory.py)


class PartitionView(msgspec.Struct, frozen=True, kw_only=True):
    """A partition's limits and policy as `scontrol show partition` and `sinfo -l` show
    them (docs/configuration.md); None: no limit."""

    name: str
    default_time_s: int
    max_time_s: int | None = None
    max_nodes: int | None = None  # per job
    max_gpus_per_job: int | None = None
    allowed_accounts: tuple[str, ...] = ()  # empty: every account
    allowed_qos: tuple[str, ...] = ()  # empty: every QOS
    default_qos: str | None = None
    priority_tier: int = 0
    preempt_mode: str = "requeue"
    requires_approval: bool = False
    def_mem_per_gpu_mib: int = 0  # --mem a job giving none gets, per GPU or CPU (0: none)
    def_mem_per_cpu_mib: int = 0


class ReservationView(msgspec.Struct, frozen=True, kw_only=True):
    """A reservation or maintenance window of the configuration (docs/configuration.md)
    as `scontrol show reservation` and `sinfo -T` show it: its occurrence open now, or
    else the next."""

    name: str
    start: float
    end: float
    nodes: tuple[str, ...] = ()  # empty with gpus == 0: the whole cluster
    gpus: int = 0  # a GPU count instead of named nodes (the placer picks whole nodes)
    accounts: tuple[str, ...] = ()  # who may run inside; empty: nobody
    recurrence: str = "none"  # none | daily | weekly
    maintenance: bool = False


class NodesReply(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeView, ...]
    partitions: tuple[str, ...] = ()  # every partition, in the config's order
    default_partition: str = ""  # what a job without -p gets (sinfo marks it `*`)
    # each partition's longest time limit in seconds (sinfo's TIMELIMIT); absent: none
    time_limits: dict[str, int] = {}
    # each configured partition's limits, in the config's order (none without a config)
    partition_views: tuple[PartitionView, ...] = ()
    reservations: tuple[ReservationView, ...] = ()  # by name


class NodeAction(Request, frozen=True, kw_only=True):
    node: str
    reason: str = ""


class Ok(msgspec.Struct, frozen=True, kw_only=True):
    message: str = "ok"
    job_ids: tuple[int, ...] = ()
    skipped: tuple[str, ...] = ()  # jobs selected but left alone, each with why


class ReloadReply(msgspec.Struct, frozen=True, kw_only=True):
    """`muster reload`: the configuration now in force (or why the file was refused)."""

    message: str
    path: str = ""
    partitions: tuple[str, ...] = ()
    changed: bool = False


class ApiError(msgspec.Struct, frozen=True, kw_only=True):
    error: str
    code: str = "invalid"
    details: tuple[str, ...] = ()


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """Every reply: exactly one of `ok` (raw JSON of the result) or `error`."""

    ok: msgspec.Raw = msgspec.Raw(b"null")
    error: ApiError | None = None


# --- node agent (launcher executor + health probe on each node) --------------------


class AgentGrant(msgspec.Struct, frozen=True, kw_only=True):
    """What the launcher allows one node agent to do (shared/agent_auth.py): `verb` on
    this job's worker (allocation `attempt`, start `generation`) on `node`, as `user`,
    until `expires_ms`; `digest` binds the request's every other field."""

    v: int = 1
    verb: str  # start | stop
    job_id: int
    attempt: int | None = None
    generation: int | None = None
    node: str
    user: str = ""  # the account it runs as ("": the agent's own)
    expires_ms: int
    digest: str  # sha256 of the request without its token (agent_auth.digest)


class AgentToken(msgspec.Struct, frozen=True, kw_only=True):
    """The launcher's ed25519 signature (`sig`, base64) of `grant`, by public key `key`."""

    key: str
    sig: str
    grant: AgentGrant


class WorkerLimits(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker may use on its node (enforced by its cgroup, docs/isolation.md):
    None is unlimited; `gpus` None (unknown) confines no GPU device."""

    memory_mib: int | None = None  # --mem (per node), or --mem-per-gpu x GPUs
    cpus: float | None = None  # --cpus-per-task x tasks per node
    gpus: tuple[int, ...] | None = None  # the node's GPU indices the job holds
    io_weight: int | None = None  # the account's / partition's [io] settings
    io_read_bps: int | None = None
    io_write_bps: int | None = None


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    attempt: int
    generation: int  # restart count: a newer generation supersedes older workers
    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    stdout: str
    stderr: str
    run_as: str | None = None
    script: str = ""  # written to the agent's spool as `script_name`; "{spool}" in argv
    script_name: str = "script.sh"  # and env is replaced by that spool folder
    token: AgentToken | None = None  # the launcher's signature: none, nothing runs
    limits: WorkerLimits | None = None  # None: an older launcher, nothing confined


class StopWorkers(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    grace_s: float = 10.0
    signal: str = "SIGTERM"
    wait: bool = True
    scope: SignalScope = SignalScope.WORKER  # a signal's (`wait=False`)
    # Set: stop only a worker of this attempt (and generation), so a stop aimed at a
    # stale worker can never hit a newer one of the same job.
    attempt: int | None = None
    generation: int | None = None
    token: AgentToken | None = None  # the launcher's signature: none, nothing is stopped


class InjectFault(msgspec.Struct, frozen=True, kw_only=True):
    gpu: int = 0
    xid: int = 79
    recovery_action: int | None = None
    lose_gpu: bool = False


class StatusRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`status` -> a node agent: what runs there and what is starting (`AgentReply`)."""


class FreePortRequest(msgspec.Struct, frozen=True, kw_only=True):
    """`muster.agent.<node>.port`: a TCP port free on that node, for a rendezvous."""


class AgentReply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    message: str = ""
    workers: tuple[tuple[int, int, int], ...] = ()  # (job_id, attempt, generation) alive
    # `status`: (job_id, attempt, generation) whose start is under way (a prolog may take
    # longer than one request's timeout: the launcher waits while its start is listed)
    starting: tuple[tuple[int, int, int], ...] = ()
    # `status`: (job_id, attempt, generation, step id) of the srun steps running there (a
    # step's answer waits on its tasks: the launcher asks again while it is listed)
    steps: tuple[tuple[int, int, int, int], ...] = ()
    port: int = 0  # `port`: a TCP port free on the node's own address right now
    answered: bool = True  # False: made up by the caller, the agent never answered


# --- job steps (srun inside an allocation; docs/steps.md) ------------------------------


class StepRequest(Request, frozen=True, kw_only=True):
    """`srun` inside job `job_id` -> the launcher (`muster.api.step`): run `argv` on the
    allocation's nodes. 0 means "not given": one task per node on every node."""

    job_id: int
    argv: tuple[str, ...]
    nodes: int = 0  # -N
    ntasks: int = 0  # -n
    ntasks_per_node: int = 0  # --ntasks-per-node
    gpus_per_task: int = 0  # --gpus-per-task
    gpus_per_node: int = 0  # --gpus-per-node, --gres=gpu:N (the node's tasks share them)
    gpus: int = 0  # --gpus / -G: the step's total, split evenly over its nodes
    # --overlap: the tasks' GPUs may be ones the job's running steps hold, and this step
    # holds none (a step with --gpus-per-task holds its GPUs alone otherwise: another
    # step that needs them is refused "busy", and srun asks again)
    overlap: bool = False
    nodelist: tuple[str, ...] = ()  # -w, expanded: exactly these nodes of the allocation
    # -K: a task that exits non-zero (or is killed by a signal) ends the step's others
    kill_on_bad_exit: bool = False
    workdir: str = ""
    environment: dict[str, str] = {}  # the caller's (the job's) environment
    output_dir: str = ""  # each task writes <output_dir>/<procid>.out and .err
    # `srun --pty`: one task on the first node, on a terminal whose bytes travel on
    # `<pty>.out` (agent -> srun) and `<pty>.in` (srun -> agent); "" for none.
    pty: str = ""
    # srun's terminal size as the step starts, "ROWS COLS" (shared/pty_size.py); ""
    # for none (its later changes travel on `<pty>.in`)
    pty_window: str = ""
    # answer RUNNING as soon as the step is made, not after the launcher's usual wait:
    # `srun --pty` keeps its terminal as it is (Ctrl-C ends srun) while the step waits
    # for GPUs, and makes it raw once the step exists; `srun --output` opens its files
    answer_made: bool = False


class StepReply(msgspec.Struct, frozen=True, kw_only=True):
    step_id: int
    state: str  # StepState; RUNNING: not ended yet, ask again (the same request)
    nodes: tuple[str, ...] = ()
    ntasks: int = 0
    # tasks on each of `nodes`, ranks in blocks (in the answer as the step is made:
    # srun's --output names a task's node; () from an older launcher)
    tasks_per_node: tuple[int, ...] = ()
    exit_code: int | None = None  # the highest of the tasks'
    signal: int | None = None
    message: str = ""


class StepView(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int = 0  # in a queue's reply (a job's own `show` lists only its steps: 0)
    step_id: int
    argv: tuple[str, ...]
    nodes: tuple[str, ...]
    ntasks: int
    state: str
    exit_code: int | None
    started_at: float
    ended_at: float | None
    # the GPUs the step holds alone while it runs, by node (--gpus-per-task without
    # --overlap; steps_core.layout); {} for a step that holds none
    gpus: dict[str, tuple[int, ...]] = {}


class StepTaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    procid: int
    env: dict[str, str]
    stdout: str
    stderr: str


class StepLaunch(msgspec.Struct, frozen=True, kw_only=True):
    """Launcher -> agent (`muster.agent.<node>.step`), signed like a start: run these
    tasks of step `step_id` inside the job's running worker (attempt, generation)."""

    job_id: int
    attempt: int
    generation: int
    step_id: int
    argv: tuple[str, ...]
    tasks: tuple[StepTaskSpec, ...]
    workdir: str
    run_as: str | None = None
    pty: str = ""  # see StepRequest.pty
    pty_window: str = ""  # see StepRequest.pty_window
    token: AgentToken | None = None
    # another launcher replica took the step over: answer with its outcome once it ends
    # (at once if it has), never start it; a step the agent does not know is lost
    adopt: bool = False
    kill_on_bad_exit: bool = False  # see StepRequest: this node's other tasks end too


class StepCancelRequest(Request, frozen=True, kw_only=True):
    """srun interrupted (Ctrl-C) -> the launcher (`muster.api.step_cancel`): end the
    step it started, named by the job and the step's output folder (srun's own); or
    `scancel JOB.STEP`: the step named by its id (`output_dir` then "")."""

    job_id: int
    output_dir: str = ""
    step_id: int | None = None
    # `scancel -s USR1 JOB.STEP`: this signal to the step's tasks, which are not ended
    # ("" ends the step)
    signal: str = ""


class StepStop(msgspec.Struct, frozen=True, kw_only=True):
    """Launcher -> agent (`muster.agent.<node>.step_stop`), signed: end the tasks of the
    job's step writing under `output_dir` (SIGTERM, SIGKILL after `grace_s`); or, with
    `signal`, send them that signal alone."""

    job_id: int
    attempt: int
    generation: int
    output_dir: str
    grace_s: float = 5.0
    signal: int = 0  # a signal's number; 0: end the tasks
    token: AgentToken | None = None


class StepOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The agent's answer once every task of its share of the step ended."""

    ok: bool
    message: str = ""
    exit_codes: tuple[int | None, ...] = ()  # per task, in `tasks` order
    signals: tuple[int | None, ...] = ()
    # per task: ended by a stop (srun's Ctrl-C, scancel JOB.STEP, -K for another task's
    # end, the node fenced), not by itself; () from an older agent, which did not say
    stopped: tuple[bool, ...] = ()
    # per task: its node failed it: fenced (the node lost the control plane past
    # fence_s) or lost (its stepd gone without a word, with the node); () from an older
    # agent. The launcher then ends the job's run as a node fault (`job.node_lost`)
    node_failed: tuple[bool, ...] = ()
