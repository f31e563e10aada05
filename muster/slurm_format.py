"""Pure: Slurm's output format strings, parsed and rendered over the API's views.

`squeue -o "%.18i %.9P %.8j %T"` and `-O "JobID:10,Name,State"`, `sinfo -o "%N %T"`
and `sacct -o JobID,State%12`: each string parses once into `Part`s (literal text and
fields with a width and a side) and renders one line per row, as Slurm does: a width
pads and truncates, `.` right-justifies, `%%` is a percent sign. No I/O and no clock:
the shims (muster/shims.py) pass `now` and the rows in.
"""

from __future__ import annotations

import time

from shared.spans import spans

TYPE_CHECKING = False  # mypy takes it as true; the lean squeue (muster.lean) imports this
if TYPE_CHECKING:  # module, and `re`, `typing` and msgspec each cost it more than its work
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from shared.api import JobView, NodeView


class FormatError(ValueError):
    """A format string names a field this command does not know; the message lists them."""


class Field(tuple[str, "int | None", bool]):
    """A field of a format string (a tuple with named fields, as a NamedTuple would be,
    without `typing`): `key` the field's letter (`-o`) or name (`-O`, sacct), lower case
    for names; `width` pads and truncates to that many characters; `right` justifies."""

    __slots__ = ()

    def __new__(cls, key: str, width: int | None = None, right: bool = False) -> Field:
        return super().__new__(cls, (key, width, right))

    @property
    def key(self) -> str:
        return self[0]

    @property
    def width(self) -> int | None:
        return self[1]

    @property
    def right(self) -> bool:
        return self[2]

    def __repr__(self) -> str:
        return f"Field(key={self.key!r}, width={self.width!r}, right={self.right!r})"


if TYPE_CHECKING:
    Part = str | Field  # literal text between fields, or a field

# --- values ---------------------------------------------------------------------------

COMPACT = {
    "PENDING": "PD",
    "CONFIGURING": "CF",
    "STARTING": "CF",
    "RUNNING": "R",
    "PREEMPTING": "R",
    "COMPLETING": "CG",
    "REQUEUED": "RQ",
    "COMPLETED": "CD",
    "FAILED": "F",
    "CANCELLED": "CA",
    "TIMEOUT": "TO",
    "NODE_FAIL": "NF",
    "OUT_OF_MEMORY": "OOM",
    "PREEMPTED": "PR",
}


# a compact code's states: `R` is RUNNING and PREEMPTING (a job in its grace time
# still runs), `CF` CONFIGURING and STARTING
LONG_STATES: dict[str, tuple[str, ...]] = {}
for _long, _short in COMPACT.items():
    LONG_STATES[_short] = (*LONG_STATES.get(_short, ()), _long)


def state_filter(names: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """squeue's `-t` (split at commas): long names or compact codes (`PD,R`), `all`;
    (the states asked for, whether every state is)."""
    upper = [s.upper() for s in names]
    if "ALL" in upper:
        return (), True
    return tuple(dict.fromkeys(x for s in upper for x in LONG_STATES.get(s, (s,)))), False


def duration(seconds: float | None) -> str:
    """Slurm's elapsed time: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`."""
    if seconds is None:
        return "INVALID"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"


def limit(seconds: int) -> str:
    return "UNLIMITED" if seconds <= 0 else duration(seconds)


def stamp(epoch: float | None) -> str:
    """A time as squeue and sacct show one (local time), `N/A` or `Unknown` when none."""
    if epoch is None:
        return "N/A"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


def checked_line(spec: dict[str, Any]) -> str:
    """`sbatch --test-only`: the job admission accepted and did not store, in Slurm's
    words where it has some; a start time it leaves out (Muster estimates the starts of
    queued jobs only: `squeue --start` once submitted)."""
    low, high = spec.get("nodes_min", 1), spec.get("nodes_max", 1)
    nodes = str(low) if low == high else f"{low}-{high}"
    gpus = spec.get("gpus_total") or spec.get("gpus_per_node", 0)
    per = "in all" if spec.get("gpus_total") else "per node"
    return (
        f"sbatch: Job would be accepted: {nodes} node(s), {gpus} GPU(s) {per}, in partition"
        f" {spec.get('partition', '')}, time limit {limit(spec.get('time_limit_s', 0))}"
        " (--test-only: nothing was submitted)"
    )


def job_id(job: JobView) -> str:
    """`123`, or `120_3` for an array task, as squeue's `%i` shows it (`120_[3-9]` for
    an array's pending tasks on one line)."""
    if job.array_job_id is not None and job.array_task_id is not None:
        return f"{job.array_job_id}_{task_id(job)}"
    return str(job.job_id)


def task_id(job: JobView) -> str:
    """`%K`: an array task's id, `[3-9]` for pending tasks on one line, or N/A."""
    if isinstance(job, PendingTasks):
        return job.tasks
    return _or_na(job.array_task_id)


class PendingTasks:
    """An array's pending tasks that wait for the same reason, on one line, as squeue
    shows them without `-r`: the first task's fields, its task id their ranges and the
    array's `%K` throttle (`8_[2-7%2]`)."""

    __slots__ = ("first", "tasks")

    def __init__(self, first: Any, tasks: str) -> None:
        self.first = first
        self.tasks = tasks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.first, name)


def collapse_arrays(jobs: Iterable[Any]) -> list[Any]:
    """Each array's pending tasks of one reason as one row, where the first of them
    was (squeue's default; `-r` lists every task). Running and finished tasks, and a
    lone pending one, keep a row each."""
    out: list[Any] = []
    groups: dict[tuple[int, str], list[int]] = {}  # (array, reason): task ids
    first: dict[tuple[int, str], int] = {}  # the row the group takes
    for j in jobs:
        if j.state == "PENDING" and j.array_job_id is not None and j.array_task_id is not None:
            key = (j.array_job_id, j.reason)
            if key in groups:
                groups[key].append(j.array_task_id)
                continue
            groups[key], first[key] = [j.array_task_id], len(out)
        out.append(j)
    for key, tasks in groups.items():
        if len(tasks) > 1:
            row = out[first[key]]
            throttle = f"%{row.array_max_running}" if row.array_max_running else ""
            out[first[key]] = PendingTasks(row, f"[{spans(sorted(tasks))}{throttle}]")
    return out


# A pending job's reason codes (services/placer/core/model.py `Waiting`, and the holds)
# by Slurm's names, which scripts and dashboards test `squeue -o %r` for. Those without
# an equal in Slurm (TOPOLOGY, PREEMPTING, NOT_TESTED) keep Muster's.
SLURM_REASON = {
    "HELD": "JobHeldUser", "HELD_ADMIN": "JobHeldAdmin", "APPROVAL": "JobHeldAdmin",
    "PRIORITY": "Priority", "RESOURCES": "Resources", "BEGIN_TIME": "BeginTime",
    "DEPENDENCY": "Dependency", "SINGLETON": "Dependency",
    "DEPENDENCY_NEVER_SATISFIED": "DependencyNeverSatisfied",
    "JOB_ARRAY_TASK_LIMIT": "JobArrayTaskLimit", "RESERVATION": "Reservation",
    "NODES_EXCLUDED": "ReqNodeNotAvail", "BAD_CONSTRAINTS": "BadConstraints",
    "PARTITION_DOWN": "PartitionDown",
    "USER_MAX_GPUS": "AssocGrpGRES", "ACCOUNT_MAX_GPUS": "AssocGrpGRES",
    "USER_MAX_JOBS": "AssocMaxJobsLimit", "ACCOUNT_MAX_JOBS": "AssocGrpJobsLimit",
    "QOS_MAX_GPUS": "QOSGrpGRES", "QOS_MAX_JOBS": "QOSGrpJobsLimit",
    "QOS_MAX_GPUS_PER_USER": "QOSMaxGRESPerUser",
    "QOS_MAX_JOBS_PER_USER": "QOSMaxJobsPerUserLimit",
    "QOS_MAX_GPUS_PER_ACCOUNT": "QOSMaxGRESPerAccount",
    "QOS_MAX_JOBS_PER_ACCOUNT": "QOSMaxJobsPerAccount",
}  # fmt: skip
# A job that ran: its reason is how it ended, a sentence; Slurm's `%r` gives a code.
ENDED_REASON = {
    "FAILED": "NonZeroExitCode", "TIMEOUT": "TimeLimit", "NODE_FAIL": "NodeDown",
    "OUT_OF_MEMORY": "OutOfMemory",
}  # fmt: skip


def reason(job: JobView) -> str:
    """`%r`: a pending job's reason code, as Slurm names it where it has a name of its
    own; for any other job Slurm's code for how it ended, or None."""
    if job.state != "PENDING":
        return ENDED_REASON.get(job.state, "None")
    code = job.reason.split(" ", 1)[0]
    return SLURM_REASON.get(code, code) or "None"


def reason_text(job: JobView) -> str:
    """The whole reason (`scontrol show job`'s `Reason=`), its code named as Slurm names
    it where it has a name of its own: `JobHeldUser`, `all 2 workers exited 0`."""
    code, _, rest = job.reason.partition(" ")
    named = SLURM_REASON.get(code, code)
    return f"{named} {rest}" if rest else named or "None"


def reason_list(job: JobView) -> str:
    """`%R`: the nodes of a job that holds some, else `(Reason)`."""
    if job.nodelist:
        return compress(job.nodelist)
    return f"({reason(job)})"


def compress(names: Iterable[str]) -> str:
    """Slurm's hostlist: `node01,node02,node03,gpu7` -> `gpu7,node[01-03]`."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        stem = name.rstrip("0123456789")
        tail = name[len(stem) :]
        if not tail:
            plain.append(name)
        else:
            groups.setdefault((stem, len(tail)), []).append(int(tail))
    out = list(plain)
    for (prefix, digits), numbers in groups.items():
        if len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{digits}d}")
            continue
        ranges, run = [], [numbers[0]]
        for n in sorted(numbers)[1:]:
            if n == run[-1] + 1:
                run.append(n)
            else:
                ranges.append(run)
                run = [n]
        ranges.append(run)
        text = ",".join(
            f"{r[0]:0{digits}d}" + (f"-{r[-1]:0{digits}d}" if len(r) > 1 else "") for r in ranges
        )
        out.append(f"{prefix}[{text}]")
    return ",".join(sorted(out))


if TYPE_CHECKING:
    Getter = Callable[[Any], str]
    Column = tuple[str, Getter]  # (header, value)

# squeue: `-o` letters and `-O` names onto one set of columns
JOB_COLUMNS: dict[str, Column] = {
    "jobid": ("JOBID", job_id),
    "jobidraw": ("JOBID", lambda j: str(j.job_id)),
    "arrayjobid": ("ARRAY_JOB_ID", lambda j: str(j.array_job_id or j.job_id)),
    "arraytaskid": ("ARRAY_TASK_ID", task_id),
    "name": ("NAME", lambda j: j.name),
    "username": ("USER", lambda j: j.user),
    "account": ("ACCOUNT", lambda j: j.account),
    "partition": ("PARTITION", lambda j: j.partition),
    "qos": ("QOS", lambda j: j.qos),
    "state": ("STATE", lambda j: j.state),
    "statecompact": ("ST", lambda j: COMPACT.get(j.state, j.state[:2])),
    "timeused": ("TIME", lambda j: duration(j.elapsed_s)),
    "timelimit": ("TIME_LIMIT", lambda j: limit(j.time_limit_s)),
    "timeleft": ("TIME_LEFT", lambda j: _time_left(j)),
    "numnodes": ("NODES", lambda j: str(j.nodes)),
    "reasonlist": ("NODELIST(REASON)", reason_list),
    "nodelist": ("NODELIST", lambda j: compress(j.nodelist)),
    "reason": ("REASON", reason),
    "tres-per-node": ("TRES_PER_NODE", lambda j: _gres_per_node(j)),
    "numgpus": ("GPUS", lambda j: str(j.gpus)),
    "submittime": ("SUBMIT_TIME", lambda j: stamp(j.submitted_at)),
    "starttime": ("START_TIME", lambda j: stamp(j.started_at or j.estimated_start)),
    "endtime": ("END_TIME", lambda j: stamp(j.ended_at)),
    "exitcode": ("EXIT_CODE", lambda j: "" if j.exit_code is None else f"{j.exit_code}:0"),
    "restartcnt": ("RESTARTCNT", lambda j: str(j.restart_count)),
    "dependency": ("DEPENDENCY", lambda j: unmet(j)),
}

SQUEUE_LETTERS = {
    "i": "jobid",
    "A": "jobidraw",
    "F": "arrayjobid",
    "K": "arraytaskid",
    "j": "name",
    "u": "username",
    "a": "account",
    "P": "partition",
    "q": "qos",
    "T": "state",
    "t": "statecompact",
    "M": "timeused",
    "l": "timelimit",
    "L": "timeleft",
    "D": "numnodes",
    "R": "reasonlist",
    "N": "nodelist",
    "r": "reason",
    "b": "tres-per-node",
    "V": "submittime",
    "S": "starttime",
    "e": "endtime",
    "E": "dependency",
}
SQUEUE_NAMES = {"user": "username", "st": "statecompact", "jobarrayid": "jobid"}
SQUEUE_DEFAULT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
# `squeue --start`: pending jobs and when the placer expects them to start (Slurm's
# columns but SCHEDNODES, which Muster does not plan per node ahead of the start)
SQUEUE_START = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R"
SQUEUE_LONG = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"  # `squeue -l`, Slurm's


class StepLine:
    """One running step as `squeue -s` shows it: the step, with its job's partition and
    user, and how long it has run at `now`."""

    __slots__ = ("argv", "job_id", "nodes", "ntasks", "partition", "seconds", "step_id", "user")

    def __init__(self, step: Any, job: Any, now: float) -> None:
        self.job_id, self.step_id, self.argv = step.job_id, step.step_id, step.argv
        self.nodes, self.ntasks = step.nodes, step.ntasks
        self.partition, self.user = job.partition, job.user
        self.seconds = now - step.started_at


# squeue -s: a line per running srun step
STEP_COLUMNS: dict[str, Column] = {
    "stepid": ("STEPID", lambda s: f"{s.job_id}.{s.step_id}"),
    "stepname": ("NAME", lambda s: s.argv[0].rsplit("/", 1)[-1] if s.argv else ""),
    "partition": ("PARTITION", lambda s: s.partition),
    "user": ("USER", lambda s: s.user),
    "timeused": ("TIME", lambda s: duration(s.seconds)),
    "numtasks": ("TASKS", lambda s: str(s.ntasks)),
    "nodelist": ("NODELIST", lambda s: compress(s.nodes)),
}
STEP_LETTERS = {
    "i": "stepid",
    "j": "stepname",
    "P": "partition",
    "u": "user",
    "M": "timeused",
    "A": "numtasks",
    "N": "nodelist",
}
STEP_DEFAULT = "%.15i %.8j %.9P %.8u %.9M %N"  # Slurm's squeue -s


def _or_na(value: int | None) -> str:
    return "N/A" if value is None else str(value)


def _time_left(j: JobView) -> str:
    if j.time_limit_s <= 0:
        return "UNLIMITED"
    return duration(max(0.0, j.time_limit_s - j.elapsed_s))


def _gres_per_node(j: JobView) -> str:
    per = j.gpus // max(1, j.nodes)
    return f"gres/gpu:{per}" if per else "N/A"


# --- sinfo ----------------------------------------------------------------------------


def node_state(n: NodeView, compact: bool = False) -> str:
    """Slurm's node state from Muster's: idle, mixed, allocated; drained, draining;
    down; `*` after it when the node does not answer (SUSPECT)."""
    busy = n.gpus_total - n.gpus_free if n.state == "UP" else _held(n)
    use = "idle" if busy == 0 else "allocated" if busy >= n.gpus_total else "mixed"
    state = {
        "UP": use,
        "SUSPECT": f"{use}*",
        "CLEANING": "completing",
        "DRAINING": "draining" if busy else "drained",
        "DRAINED": "drained",
        "DOWN": "down*",
        "FAILED": "fail",
    }.get(n.state, n.state.lower())
    if not compact:
        return state
    short = {"allocated": "alloc", "mixed": "mix", "draining": "drng", "drained": "drain"}
    star = "*" if state.endswith("*") else ""
    return short.get(state.rstrip("*"), state.rstrip("*")[:5]) + star


def _held(n: NodeView) -> int:
    return sum(1 for g in n.gpus if g.allocated_to is not None)


NODE_COLUMNS: dict[str, Column] = {
    "nodelist": ("NODELIST", lambda n: n.name),
    "nodehost": ("HOSTNAMES", lambda n: n.name),
    "statelong": ("STATE", lambda n: node_state(n)),
    "statecompact": ("STATE", lambda n: node_state(n, compact=True)),
    "gres": ("GRES", lambda n: f"gpu:{n.gpu_type + ':' if n.gpu_type else ''}{n.gpus_total}"),
    "gresused": ("GRES_USED", lambda n: f"gpu:{n.gpus_total - n.gpus_free}"),
    "features": ("AVAIL_FEATURES", lambda n: ",".join(n.features) or "(null)"),
    "reason": ("REASON", lambda n: reason_by(n.reason)[1] or "none"),
    "reasonuser": ("USER", lambda n: reason_by(n.reason)[0]),
    "reasontime": ("TIMESTAMP", lambda n: stamp(n.state_since) if n.state_since else "Unknown"),
    "nodes": ("NODES", lambda n: "1"),
    "cpus": ("CPUS", lambda n: str(n.cpus) if n.cpus else "N/A"),
    "cpusaiot": ("CPUS(A/I/O/T)", lambda n: _cpus_aiot([n])),
    "memory": ("MEMORY", lambda n: str(n.memory_mib) if n.memory_mib else "N/A"),
    # a row of sinfo is one node in one partition (see `_by_partition`)
    "partition": ("PARTITION", lambda n: _partition(n)),
    "partitionname": ("PARTITION", lambda n: _partition(n)),
}
SINFO_LETTERS = {
    "F": "nodesaiot",
    "a": "avail",
    "l": "timelimit",
    "N": "nodelist",
    "n": "nodehost",
    "T": "statelong",
    "t": "statecompact",
    "G": "gres",
    "f": "features",
    "E": "reason",
    "D": "nodes",
    "P": "partition",
    "R": "partitionname",
    "s": "jobsize",
    "r": "root",
    "h": "oversubscribe",
    "g": "groups",
    "c": "cpus",
    "m": "memory",
    "C": "cpusaiot",
    "u": "reasonuser",
    "H": "reasontime",
}
SINFO_NODES_DEFAULT = "%N %.6D %P %.6t"
SINFO_DEFAULT = "%9P %.5a %.10l %.6D %.6t %N"  # Slurm's
SINFO_SUMMARY = "%9P %.5a %.10l %.16F %N"  # `sinfo -s`: a line per partition
# `sinfo -l`, Slurm's; `-N -l` with the node's CPUs, memory (MiB) and GPUs, where
# Slurm also has sockets, disk and weight, which Muster does not record
SINFO_LONG = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
SINFO_NODES_LONG = "%N %.6D %.9P %.11T %.4c %.8m %.12G %.8f %20E"


SINFO_REASONS = "%50E %9u %19H %N"  # `sinfo -R`: nodes out of service and why, Slurm's
OUT_OF_SERVICE = ("drained", "draining", "down", "fail")  # what `sinfo -R` lists


def reason_by(reason: str) -> tuple[str, str]:
    """(who set it, what it says) of a node's reason: an operator's drain (health's
    `drained by NAME: TEXT`) or Muster's own (a fault, a failed check), as Slurm names
    its own `slurm`; `(null)` for a node without one."""
    if not reason:
        return "(null)", ""
    if reason.startswith("drained by ") and ": " in reason:
        who, _, text = reason[len("drained by ") :].partition(": ")
        return who, text
    return "muster", reason


def reservation_table(views: Sequence[Any], now: float, header: bool) -> list[str]:
    """`sinfo -T`: Slurm's `RESV_NAME STATE START_TIME END_TIME DURATION NODELIST`, a line
    per reservation at its window open now or next."""
    rows = [
        (
            v.name,
            "ACTIVE" if v.start <= now < v.end else "INACTIVE",
            stamp(v.start),
            stamp(v.end),
            duration(v.end - v.start),
            compress(v.nodes) if v.nodes else f"({v.gpus} GPUs)" if v.gpus else "ALL",
        )
        for v in views
    ]
    line = "{:>9} {:>8} {:>19} {:>19} {:>11} {}"
    head = ("RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION", "NODELIST")
    return [line.format(*head)] * header + [line.format(*r) for r in rows]


def long_header(now: float) -> str:
    """The first line of `squeue -l` and `sinfo -l`: when it was read."""
    return time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(now))


# --- sacct ----------------------------------------------------------------------------

ACCT_COLUMNS: dict[str, Column] = {
    # JOB.STEP for an srun step; a requeued attempt (-D) is the job's id, as Slurm's are
    "jobid": ("JobID", lambda r: str(r.job_id) + ("" if r.step is None else f".{r.step}")),
    "jobidraw": ("JobIDRaw", lambda r: str(r.job_id) + ("" if r.step is None else f".{r.step}")),
    "jobname": ("JobName", lambda r: r.name),
    "user": ("User", lambda r: r.user),
    "account": ("Account", lambda r: r.account),
    "partition": ("Partition", lambda r: r.partition),
    "state": ("State", lambda r: r.state),
    "exitcode": ("ExitCode", lambda r: "" if r.exit_code is None else f"{r.exit_code}:0"),
    "elapsed": ("Elapsed", lambda r: _elapsed(r)),
    "submit": ("Submit", lambda r: stamp(r.submit) if r.submit else "Unknown"),
    "start": ("Start", lambda r: stamp(r.start) if r.start else "Unknown"),
    "end": ("End", lambda r: stamp(r.end) if r.end else "Unknown"),
    "nodelist": ("NodeList", lambda r: compress(r.nodes) or "None assigned"),
    "nnodes": ("NNodes", lambda r: str(len(r.nodes))),
    "allocgres": ("AllocGRES", lambda r: f"gpu:{r.gpus}" if r.gpus else ""),
    "alloctres": ("AllocTRES", lambda r: _tres(r)),
    "elapsedraw": ("ElapsedRaw", lambda r: str(_seconds(r))),
    "reason": ("Reason", lambda r: r.reason or "None"),
    # what the job asked (a step's own are not recorded: empty) and its memory peak
    "alloccpus": ("AllocCPUS", lambda r: str(r.cpus) if r.cpus else ""),
    "ncpus": ("NCPUS", lambda r: str(r.cpus) if r.cpus else ""),
    "reqcpus": ("ReqCPUS", lambda r: str(r.cpus) if r.cpus else ""),
    "reqmem": ("ReqMem", lambda r: "" if r.step is not None else mem_words(r.mem_mib)),
    "maxrss": (
        "MaxRSS",
        lambda r: "" if r.max_rss_bytes is None else f"{r.max_rss_bytes // 1024}K",
    ),
    "maxrssnode": ("MaxRSSNode", lambda r: r.max_rss_node),
    # CPU time used (its cgroups'), and allocated: its CPUs times its elapsed time
    "totalcpu": ("TotalCPU", lambda r: "" if r.cpu_usec is None else cpu_time(r.cpu_usec)),
    "cputime": ("CPUTime", lambda r: clock(_seconds(r) * r.cpus) if r.cpus else ""),
    "cputimeraw": ("CPUTimeRAW", lambda r: str(_seconds(r) * r.cpus) if r.cpus else ""),
}
# Fields Slurm's sacct has and Muster does not record (per-task averages, virtual
# memory, CPU time, I/O, energy): shown empty, with a note on stderr (`unrecorded`),
# rather than the whole command refused for one field of a script's --format.
UNRECORDED = (
    "AveRSS", "MaxVMSize", "AveVMSize", "MaxPages", "AvePages", "UserCPU", "SystemCPU",
    "MaxDiskRead", "MaxDiskWrite", "AveDiskRead", "AveDiskWrite", "ConsumedEnergy",
)  # fmt: skip
ACCT_COLUMNS |= {name.lower(): (name, lambda r: "") for name in UNRECORDED}
ACCT_DEFAULT = "JobID,JobName,Partition,Account,State,ExitCode"
ACCT_WIDTH = 10


def cpu_time(usec: int) -> str:
    """CPU time as sacct's TotalCPU writes it: `MM:SS.mmm` under an hour, then
    `HH:MM:SS`, then `D-HH:MM:SS`."""
    seconds, ms = divmod(usec // 1000, 1000)
    if seconds < 3600:
        return f"{seconds // 60:02d}:{seconds % 60:02d}.{ms:03d}"
    return clock(seconds)


def clock(seconds: int) -> str:
    """`[D-]HH:MM:SS`, as sacct writes Elapsed and CPUTime."""
    days, s = divmod(seconds, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def mem_words(mib: int) -> str:
    """A memory size in MiB as Slurm writes one: `40G`, `1500M`; 0 (none asked) `0`."""
    if mib and mib % 1024 == 0:
        return f"{mib // 1024}G"
    return f"{mib}M" if mib else "0"


def _seconds(r: Any) -> int:
    return 0 if r.start is None else int((r.end or r.start) - r.start)


def _tres(r: Any) -> str:
    """AllocTRES as Slurm writes it, of what Muster allocates: GPUs and nodes."""
    parts = [f"gres/gpu={r.gpus}"] if r.gpus else []
    return ",".join([*parts, f"node={len(r.nodes)}"]) if r.nodes else ",".join(parts)


def unrecorded(fmt: str | None) -> list[str]:
    """The fields of a sacct `--format` that Muster does not record (shown empty)."""
    asked = {name.split("%")[0].strip().lower() for name in (fmt or "").split(",")}
    return [name for name in UNRECORDED if name.lower() in asked]


def _elapsed(r: Any) -> str:
    return "00:00:00" if r.start is None else clock(_seconds(r))


# --- parsing --------------------------------------------------------------------------


def _percents(text: str) -> Iterable[tuple[int, int, str, str, str]]:
    """Each `%[.][width]X` of `text`: (start, end, dot, width, letter), as the regular
    expression `%(\\.)?(\\d+)?(.)` finds them, backtracking included (`%12` at the end
    is the letter `2` at width 1), without loading `re`."""
    at = text.find("%")
    while 0 <= at < len(text) - 1:
        i = at + 1
        dot = "." if text[i] == "." else ""
        i += len(dot)
        j = i
        while j < len(text) and text[j] in "0123456789":
            j += 1
        if j < len(text) and text[j] != "\n":  # `.` matches anything but a newline
            yield at, j + 1, dot, text[i:j], text[j]
            at = text.find("%", j + 1)
        elif j > i:  # give the last digit back: it is the letter
            yield at, j, dot, text[i : j - 1], text[j - 1]
            at = text.find("%", j)
        elif dot:
            yield at, i, "", "", "."
            at = text.find("%", i)
        else:
            at = text.find("%", at + 1)


def parse_percent(text: str, letters: dict[str, str]) -> list[Part]:
    """`squeue -o` / `sinfo -o`: `%[.][width]X` fields among literal text."""
    parts: list[Part] = []
    at = 0
    for start, end, dot, width, letter in _percents(text):
        if start > at:
            parts.append(text[at:start])
        at = end
        if letter == "%":
            parts.append("%")
            continue
        if letter not in letters:
            known = " ".join(f"%{k}" for k in letters)
            raise FormatError(f"unknown field %{letter} in {text!r}; known: {known}")
        parts.append(Field(letters[letter], int(width) if width else None, bool(dot)))
    if at < len(text):
        parts.append(text[at:])
    return parts


def parse_names(
    text: str,
    columns: dict[str, Column],
    aliases: dict[str, str],
    *,
    size_mark: str,
    default_width: int | None,
    sep: str = " ",
) -> list[Part]:
    """`squeue -O Name:20,State:.9` (size_mark ':') and `sacct -o JobID,State%12`
    (size_mark '%'): comma-separated names, any case, with an optional `[.]width`."""
    parts: list[Part] = []
    for item in (w.strip() for w in text.split(",")):
        if not item:
            continue
        name, _, size = item.partition(size_mark)
        key = aliases.get(name.lower(), name.lower())
        if key not in columns:
            known = ",".join(columns[k][0] for k in columns)
            raise FormatError(f"unknown field {name!r}; known: {known}")
        right = size.startswith(".")
        digits = size.lstrip(".")
        if digits and not digits.isdigit():
            raise FormatError(f"{item!r}: the width after {size_mark!r} must be a number")
        if parts and sep:
            parts.append(sep)
        parts.append(Field(key, int(digits) if digits else default_width, right))
    return parts


# --- rendering ------------------------------------------------------------------------


def fit(value: str, field: Field) -> str:
    if field.width is None:
        return value
    value = value[: field.width]
    return value.rjust(field.width) if field.right else value.ljust(field.width)


def render(
    parts: Sequence[Part],
    rows: Iterable[Any],
    columns: dict[str, Column],
    *,
    header: bool = True,
    delimiter: str | None = None,
) -> list[str]:
    """One line per row (and a header first): fields padded and truncated to their
    widths, or joined by `delimiter` unpadded (sacct --parsable2)."""
    fields = [p for p in parts if isinstance(p, Field)]

    def line(value: Callable[[Field], str]) -> str:
        if delimiter is not None:
            return delimiter.join(value(f) for f in fields)
        return "".join(p if isinstance(p, str) else fit(value(p), p) for p in parts).rstrip()

    def head(f: Field) -> str:
        return columns[f.key][0]

    out = [line(head)] if header else []
    for row in rows:  # a closure, not functools.partial: functools costs a shim its import

        def value(f: Field, row: Any = row) -> str:
            return _value(columns, row, f)

        out.append(line(value))
    return out


def _value(columns: dict[str, Column], row: Any, f: Field) -> str:
    return columns[f.key][1](row)


def squeue_lines(
    jobs: Iterable[JobView],
    fmt: str | None,
    long_fmt: str | None,
    header: bool,
    every_task: bool = False,
) -> list[str]:
    """squeue's lines; an array's pending tasks on one line unless `every_task` (-r)."""
    rows = jobs if every_task else collapse_arrays(jobs)
    return render(squeue_parts(fmt, long_fmt), rows, JOB_COLUMNS, header=header)


# `squeue -S`'s fields that sort as numbers (the rest sort as they are shown)
NUMERIC: dict[str, Callable[[JobView], float]] = {
    "jobid": lambda j: j.job_id,
    "jobidraw": lambda j: j.job_id,
    "numnodes": lambda j: j.nodes,
    "numgpus": lambda j: j.gpus,
    "timeused": lambda j: j.elapsed_s,
    "timelimit": lambda j: j.time_limit_s,
    "submittime": lambda j: j.submitted_at,
    "starttime": lambda j: j.started_at or j.estimated_start or 0.0,
    "endtime": lambda j: j.ended_at or 0.0,
}


def sort_jobs(jobs: Sequence[JobView], keys: str) -> list[JobView]:
    """`squeue -S -t,i` / `--sort=P,-i`: format letters, each `+` (ascending, as
    without) or `-` (descending), the first the strongest."""
    out = list(jobs)
    for word in reversed([w.strip() for w in keys.split(",") if w.strip()]):
        letter = word.lstrip("+-")
        if letter not in SQUEUE_LETTERS:
            known = " ".join(SQUEUE_LETTERS)
            raise FormatError(f"unknown sort field {letter!r} in {keys!r}; known: {known}")
        name = SQUEUE_LETTERS[letter]
        number = NUMERIC.get(name)
        if number is not None:
            out.sort(key=number, reverse=word.startswith("-"))
        else:
            shown = JOB_COLUMNS[name][1]
            out.sort(key=shown, reverse=word.startswith("-"))
    return out


def squeue_parts(fmt: str | None, long_fmt: str | None) -> list[Part]:
    if long_fmt is not None:
        # --Format puts no space between fields: the widths do
        return parse_names(
            long_fmt, JOB_COLUMNS, SQUEUE_NAMES, size_mark=":", default_width=20, sep=""
        )
    return parse_percent(fmt or SQUEUE_DEFAULT, SQUEUE_LETTERS)


def asks_dependency(fmt: str | None, long_fmt: str | None) -> bool:
    """Whether the columns include `%E`, which the queue's reply carries only when
    asked (QueueRequest.dependencies); a bad format is left to say so when rendered."""
    try:
        parts = squeue_parts(fmt, long_fmt)
    except FormatError:
        return False
    return any(isinstance(p, Field) and p.key == "dependency" for p in parts)


def unmet(job: JobView) -> str:
    """`%E`: each job a pending job still waits on, as Slurm's marks it,
    `afterok:12(unfulfilled),afterok:13(unfulfilled)` (`failed` once it can never be
    met); `(null)` for a job whose dependency is met or that has none."""
    if not job.dependency:
        return "(null)"
    mark = "failed" if job.reason.startswith("DEPENDENCY_NEVER_SATISFIED") else "unfulfilled"
    sep = "?" if "?" in job.dependency else ","
    out = []
    for term in job.dependency.split(sep):
        kind, _, ids = term.partition(":")
        out += [f"{kind}:{i}({mark})" for i in ids.split(":")] if ids else [f"{kind}({mark})"]
    return sep.join(out)


def step_lines(
    steps: Iterable[Any], jobs: Iterable[JobView], fmt: str | None, header: bool, now: float
) -> list[str]:
    """`squeue -s [-o FORMAT]`: the running steps of `jobs`, Slurm's step letters."""
    by_id = {j.job_id: j for j in jobs}
    rows = [StepLine(s, by_id[s.job_id], now) for s in steps if s.job_id in by_id]
    return render(
        parse_percent(fmt or STEP_DEFAULT, STEP_LETTERS), rows, STEP_COLUMNS, header=header
    )


def _partition(n: NodeView) -> str:
    return n.partitions[0] if n.partitions else "(null)"


def sinfo_lines(
    nodes: Sequence[NodeView],
    fmt: str | None,
    by_node: bool,
    header: bool,
    partitions: Sequence[str] = (),
    default_partition: str = "",
    time_limits: dict[str, int] | None = None,
    summarize: bool = False,
    long: bool = False,
    max_nodes: dict[str, int] | None = None,
    reasons: bool = False,
) -> list[str]:
    """`sinfo -N`: a line per node and partition; plain `sinfo`: per partition, nodes
    grouped by state, compressed. `%P` marks the default partition with `*`, `%R` not;
    `%l` is the partition's longest time limit (`time_limits`; none: infinite) and
    `%a` its availability, always up (Muster takes nodes out, not partitions).
    `summarize` (`-s`): a line per partition, `%F` its nodes allocated / idle / other
    (down, drained, failing) / total. `long` (`-l`): Slurm's long columns, `%s` the
    nodes a job may have (`max_nodes`; none: 1-infinite)."""
    if reasons:  # `-R`: a line per reason, who and when, its nodes; out of service alone
        parts = parse_percent(fmt or SINFO_REASONS, SINFO_LETTERS)
        out = [n for n in nodes if node_state(n).rstrip("*") in OUT_OF_SERVICE]
        return _grouped(parts, out, lambda n: (), header)
    if long:
        default = SINFO_NODES_LONG if by_node else SINFO_LONG
    else:
        default = SINFO_NODES_DEFAULT if by_node else SINFO_SUMMARY if summarize else SINFO_DEFAULT
    parts = parse_percent(fmt or default, SINFO_LETTERS)
    rows = _by_partition(nodes, partitions)
    most, widest = time_limits or {}, max_nodes or {}
    starred = NODE_COLUMNS | {
        "partition": ("PARTITION", lambda n: _starred(n, default_partition)),
        "avail": ("AVAIL", lambda n: "up"),
        "nodesaiot": ("NODES(A/I/O/T)", lambda n: _aiot([n])),
        "timelimit": (
            "TIMELIMIT",
            lambda n: duration(most[p]) if (p := _partition(n)) in most else "infinite",
        ),
        "jobsize": ("JOB_SIZE", lambda n: f"1-{widest.get(_partition(n), 'infinite')}"),
        # constants true of Muster: not root-only, GPUs never shared, no group rule
        "root": ("ROOT", lambda n: "no"),
        "oversubscribe": ("OVERSUBS", lambda n: "NO"),
        "groups": ("GROUPS", lambda n: "all"),
    }
    if by_node:
        rows.sort(key=lambda n: n.name)  # Slurm's -N: by node, then partition
        return render(parts, rows, starred, header=header)
    key = (lambda n: (_partition(n), "")) if summarize else lambda n: (_partition(n), node_state(n))
    return _grouped(parts, rows, key, header, starred)


def _grouped(
    parts: list[Part],
    rows: Sequence[NodeView],
    key: Callable[[NodeView], object],
    header: bool,
    base: dict[str, Column] = NODE_COLUMNS,
) -> list[str]:
    """A line per group of nodes with one `key` that show the same in every column
    (as Slurm's: node04 drained for another reason is a line of its own), in the order
    first seen: a group's columns are its first node's, but all its names (compressed)
    and its count."""
    shown = [p for p in parts if isinstance(p, Field) and p.key not in AGGREGATE]
    groups: dict[object, list[NodeView]] = {}
    for n in rows:
        groups.setdefault((key(n), *(_value(base, n, f) for f in shown)), []).append(n)
    columns: dict[str, Column] = {k: (h, _of_first(get)) for k, (h, get) in base.items()}
    columns["nodelist"] = ("NODELIST", lambda g: compress(n.name for n in g))
    columns["nodes"] = ("NODES", lambda g: str(len(g)))
    columns["nodesaiot"] = ("NODES(A/I/O/T)", _aiot)  # of the group, not its first
    columns["cpusaiot"] = ("CPUS(A/I/O/T)", _cpus_aiot)
    return render(parts, groups.values(), columns, header=header)


def _cpus_aiot(group: Sequence[NodeView]) -> str:
    """`%C`: of a group of nodes, CPUs allocated / idle / other (out of service) /
    total, summed over the nodes whose CPUs are known. Allocated is what the jobs
    holding a node asked of it, at most its CPUs (the placer fits CPUs, it does not
    count them out: shared/node_size.py)."""
    known = [n for n in group if n.cpus]
    if not known:
        return "N/A"
    out = {n.name for n in known if node_state(n).rstrip("*") in OUT_OF_SERVICE}
    alloc = sum(min(n.cpus_alloc, n.cpus) for n in known if n.name not in out)
    total = sum(n.cpus for n in known)
    other = sum(n.cpus for n in known if n.name in out)
    return f"{alloc}/{total - other - alloc}/{other}/{total}"


AGGREGATE = frozenset({"nodelist", "nodes", "nodesaiot", "cpusaiot"})  # of a group


def _aiot(group: Sequence[NodeView]) -> str:
    """`%F`: of a group of nodes, allocated (or mixed) / idle / other / total."""
    states = [node_state(n).rstrip("*") for n in group]
    busy = sum(1 for s in states if s in ("allocated", "mixed", "completing"))
    idle = sum(1 for s in states if s == "idle")
    return f"{busy}/{idle}/{len(states) - busy - idle}/{len(states)}"


def _by_partition(nodes: Sequence[NodeView], order: Sequence[str]) -> list[NodeView]:
    """A row per node and partition it serves (a node in none: one row), partitions in
    the config's order (`order`; else as the nodes name them)."""
    known = list(dict.fromkeys([*order, *(p for n in nodes for p in n.partitions)]))
    from msgspec.structs import replace  # sinfo only: not on squeue's lean path

    rows = [replace(n, partitions=(p,)) for p in known for n in nodes if p in n.partitions]
    return rows + [n for n in nodes if not n.partitions]


def _starred(n: NodeView, default: str) -> str:
    name = _partition(n)
    return f"{name}*" if default and name == default else name


def _of_first(get: Getter) -> Getter:
    return lambda group: get(group[0])


def oldest_first(rows: Sequence[Any]) -> tuple[Any, ...]:
    """Accounting's rows (newest job first, each job's line followed by its attempts'
    and steps') with the jobs oldest first, as Slurm's sacct lists them."""
    blocks: dict[int, list[Any]] = {}
    for row in rows:
        blocks.setdefault(row.job_id, []).append(row)
    return tuple(r for job in reversed(blocks) for r in blocks[job])


def sacct_lines(
    rows: Iterable[Any], fmt: str | None, header: bool, delimiter: str | None
) -> list[str]:
    width = None if delimiter is not None else ACCT_WIDTH
    parts = parse_names(fmt or ACCT_DEFAULT, ACCT_COLUMNS, {}, size_mark="%", default_width=width)
    lines = render(parts, rows, ACCT_COLUMNS, header=header, delimiter=delimiter)
    if header and delimiter is None:  # sacct's rule of dashes under the header
        rule = "".join(p if isinstance(p, str) else "-" * (p.width or 10) for p in parts)
        lines.insert(1, rule.rstrip())
    return lines
