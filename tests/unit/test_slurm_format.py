"""`muster.slurm_format`: Slurm's format strings (squeue -o/-O, sinfo -o, sacct -o)
parsed and rendered over the API's views, compared whole."""

from __future__ import annotations

import msgspec
import pytest
from msgspec.structs import replace

from muster.slurm_format import (
    JOB_COLUMNS,
    SQUEUE_LETTERS,
    SQUEUE_LONG,
    SQUEUE_NAMES,
    Field,
    FormatError,
    asks_dependency,
    checked_line,
    compress,
    duration,
    long_header,
    node_state,
    oldest_first,
    parse_names,
    parse_percent,
    reservation_table,
    sacct_lines,
    sinfo_lines,
    sort_jobs,
    squeue_lines,
    stamp,
    state_filter,
    unmet,
    unrecorded,
)
from shared.api import GpuView, JobView, NodeView, ReservationView


def job(**kw: object) -> JobView:
    base: dict[str, object] = dict(
        job_id=42, name="pretrain-llama", user="alice", account="ml", partition="gpu",
        qos="normal", state="RUNNING", reason="", nodes=2, gpus=16,
        nodelist=("node01", "node02"), submitted_at=1_700_000_000.0,
        started_at=1_700_000_060.0, ended_at=None, time_limit_s=7200, elapsed_s=3725.0,
        exit_code=None, restart_count=0,
    )  # fmt: skip
    return JobView(**(base | kw))  # type: ignore[arg-type]


def node(name: str, state: str = "UP", free: int = 4, total: int = 4, **kw: object) -> NodeView:
    gpus = tuple(
        GpuView(index=i, model="NVIDIA H100", healthy=True,
                allocated_to=None if i < free else 7, last_xid=None)
        for i in range(total)
    )  # fmt: skip
    base: dict[str, object] = dict(
        name=name, state=state, reason="", gpus_total=total, gpus_free=free,
        topology=("spine0", "leaf1"), last_heartbeat=None, last_fault=None, gpus=gpus,
        gpu_type="h100", partitions=("normal", "debug") if free == 0 else ("normal",),
    )  # fmt: skip
    return NodeView(**(base | kw))  # type: ignore[arg-type]


class Acct(msgspec.Struct, frozen=True, kw_only=True):
    """The fields of fairshare's AcctRow the renderer reads (a row from the API)."""

    job_id: int
    attempt: int | None = None
    step: int | None = None
    name: str = "train"
    user: str = "alice"
    account: str = "ml"
    partition: str = "gpu"
    state: str = "COMPLETED"
    gpus: int = 8
    submit: float | None = 1_700_000_000.0
    start: float | None = 1_700_000_010.0
    end: float | None = 1_700_003_671.0
    exit_code: int | None = 0
    reason: str | None = None
    nodes: tuple[str, ...] = ("node01", "node02")
    mem_mib: int = 0
    cpus: int = 2
    max_rss_bytes: int | None = None
    max_rss_node: str = ""
    cpu_usec: int | None = None


PARSE = {
    "squeue's default: widths, right-justified with a dot": (
        "%.18i %.9P %8j",
        [Field("jobid", 18, True), " ", Field("partition", 9, True), " ", Field("name", 8)],
    ),
    "literal text and %% pass through": (
        "id=%i|%%",
        ["id=", Field("jobid"), "|", "%"],
    ),
}


@pytest.mark.parametrize(("text", "want"), PARSE.values(), ids=PARSE.keys())
def test_parse_percent(text: str, want: list[object]) -> None:
    assert parse_percent(text, SQUEUE_LETTERS) == want


def test_an_unknown_letter_is_refused_naming_what_exists() -> None:
    with pytest.raises(FormatError, match=r"unknown field %Z in '%i %Z'; known: %i"):
        parse_percent("%i %Z", SQUEUE_LETTERS)


def test_long_names_take_any_case_a_width_and_a_side() -> None:
    got = parse_names("JobID:10,name,ST:.4", JOB_COLUMNS, SQUEUE_NAMES,
                      size_mark=":", default_width=20, sep="")  # fmt: skip
    want = [Field("jobid", 10), Field("name", 20), Field("statecompact", 4, True)]
    assert got == want


def test_an_unknown_long_name_is_refused() -> None:
    with pytest.raises(FormatError, match="unknown field 'Bogus'"):
        parse_names("JobID,Bogus", JOB_COLUMNS, {}, size_mark=":", default_width=20)


SQUEUE = {
    "the script-friendly pair of id and state": (
        [job(), job(job_id=43, state="PENDING", reason="PRIORITY", nodelist=(), elapsed_s=0)],
        "%i %T",
        None,
        False,
        ["42 RUNNING", "43 PENDING"],
    ),
    "squeue's default columns, truncated and padded as Slurm does": (
        [job(), job(job_id=43, state="PENDING", reason="RESOURCES (requeued: x)", nodelist=())],
        None,
        None,
        True,
        [
            "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
            "                42       gpu pretrain    alice  R    1:02:05      2 node[01-02]",
            "                43       gpu pretrain    alice PD    1:02:05      2 (Resources)",
        ],
    ),
    "every asked letter: %i %j %u %T %M %D %R %P": (
        [job(elapsed_s=59.0, nodes=1, nodelist=("gpu7",))],
        "%i|%j|%u|%T|%M|%D|%R|%P",
        None,
        False,
        ["42|pretrain-llama|alice|RUNNING|0:59|1|gpu7|gpu"],
    ),
    "an array task is ARRAY_TASK and a day shows as D-HH:MM:SS": (
        [job(job_id=51, array_job_id=50, array_task_id=1, elapsed_s=90061.0)],
        "%i %M %l",
        None,
        False,
        ["50_1 1-01:01:01 2:00:00"],
    ),
    "-O: names, widths with no space between, as squeue's --Format": (
        [job()],
        None,
        "JobID:7,State:9,UserName:6,NumNodes:.6",
        True,
        ["JOBID  STATE    USER   NODES", "42     RUNNING  alice      2"],
    ),
}


def task(task: int, state: str = "PENDING", reason: str = "JOB_ARRAY_TASK_LIMIT") -> JobView:
    return job(
        job_id=60 + task, array_job_id=60, array_task_id=task, state=state,
        reason="" if state != "PENDING" else reason,
        nodelist=("node01",) if state != "PENDING" else (),
    )  # fmt: skip


SWEEP = [task(0, "RUNNING"), task(1, "RUNNING"), *(task(t) for t in (2, 3, 4, 6)),
         task(5, reason="HELD"), task(7, reason="HELD")]  # fmt: skip


def test_an_arrays_pending_tasks_share_a_line_unless_r_asks_for_each() -> None:
    """squeue's default: pending tasks that wait alike on one line, `60_[2-4,6]`;
    running tasks, and another reason's, their own; `-r` a line each."""
    assert squeue_lines(SWEEP, "%i %T %r %K", None, False) == [
        "60_0 RUNNING None 0",
        "60_1 RUNNING None 1",
        "60_[2-4,6] PENDING JobArrayTaskLimit [2-4,6]",
        "60_[5,7] PENDING JobHeldUser [5,7]",
    ]
    every = squeue_lines(SWEEP, "%i", None, False, every_task=True)
    assert every == [f"60_{t}" for t in (0, 1, 2, 3, 4, 6, 5, 7)]
    alone = squeue_lines([task(9)], "%i %K", None, False)
    assert alone == ["60_9 9"]
    throttled = [replace(t, array_max_running=2) for t in SWEEP[2:6]]
    assert squeue_lines(throttled, "%i", None, False) == ["60_[2-4,6%2]"]  # Slurm's %K suffix


@pytest.mark.parametrize(("jobs", "fmt", "long", "header", "want"), SQUEUE.values(),
                         ids=SQUEUE.keys())  # fmt: skip
def test_squeue(
    jobs: list[JobView], fmt: str | None, long: str | None, header: bool, want: list[str]
) -> None:
    assert squeue_lines(jobs, fmt, long, header) == want


STATES = {
    "a free node is idle": (node("a"), "idle", "idle"),
    "some GPUs held: mixed": (node("a", free=2), "mixed", "mix"),
    "every GPU held: allocated": (node("a", free=0), "allocated", "alloc"),
    "draining with work left": (node("a", "DRAINING", free=0), "draining", "drng"),
    "draining with nothing left is drained": (
        node("a", "DRAINING", free=0, gpus=()),
        "drained",
        "drain",
    ),
    "silent: not responding, its use kept": (node("a", "SUSPECT", free=4), "idle*", "idle*"),
    "down": (node("a", "DOWN"), "down*", "down*"),
    "a hardware fault": (node("a", "FAILED"), "fail", "fail"),
}


@pytest.mark.parametrize(("n", "long", "short"), STATES.values(), ids=STATES.keys())
def test_node_state(n: NodeView, long: str, short: str) -> None:
    assert (node_state(n), node_state(n, compact=True)) == (long, short)


SINFO = {
    "-N -h -o '%N %T': a line per node": (
        [node("node01"), node("node02", free=0, partitions=("normal",))],
        "%N %T",
        True,
        False,
        ["node01 idle", "node02 allocated"],
    ),
    "plain sinfo groups nodes by partition and state and compresses their names": (
        [node("node01"), node("node02"), node("node03", free=0), node("node04", partitions=())],
        None,
        False,
        True,
        [
            "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
            "normal*      up 3-00:00:00      2   idle node[01-02]",
            "normal*      up 3-00:00:00      1  alloc node03",
            "debug        up      30:00      1  alloc node03",
            "(null)       up   infinite      1   idle node04",
        ],
    ),
    "sinfo -N: a line per node and partition, the default marked by %P only": (
        [node("node02", free=0), node("node01", partitions=("debug",))],
        "%N %P %R %T",
        True,
        False,
        [
            "node01 debug debug idle",
            "node02 normal* normal allocated",
            "node02 debug debug allocated",
        ],
    ),
    "the default sinfo -N columns": (
        [node("node01", partitions=("debug",))],
        None,
        True,
        True,
        ["NODELIST  NODES PARTITION  STATE", "node01      1 debug   idle"],
    ),
    "GRES and features": (
        [node("n1", features=("ib", "nvlink"))],
        "%N %G %f",
        True,
        False,
        ["n1 gpu:h100:4 ib,nvlink"],
    ),
}


@pytest.mark.parametrize(("nodes", "fmt", "by_node", "header", "want"), SINFO.values(),
                         ids=SINFO.keys())  # fmt: skip
def test_sinfo(
    nodes: list[NodeView], fmt: str | None, by_node: bool, header: bool, want: list[str]
) -> None:
    limits = {"normal": 3 * 86400, "debug": 1800}  # a partition without one: infinite
    assert sinfo_lines(nodes, fmt, by_node, header, ("normal", "debug"), "normal", limits) == want


SACCT = {
    "sacct's default columns and its rule under the header": (
        [Acct(job_id=7)],
        None,
        True,
        None,
        [
            "JobID      JobName    Partition  Account    State      ExitCode",
            "---------- ---------- ---------- ---------- ---------- ----------",
            "7          train      gpu        ml         COMPLETED  0:0",
        ],
    ),
    "-j 7 -o JobID,State%12,Elapsed -n -D: srun steps as JOB.STEP, a requeued run as JOB": (
        [
            Acct(job_id=7),
            Acct(job_id=7, attempt=1, state="NODE_FAIL"),
            Acct(job_id=7, step=0, state="FAILED"),
        ],
        "JobID,State%12,Elapsed",
        False,
        None,
        [
            "7          COMPLETED    01:01:01",
            "7          NODE_FAIL    01:01:01",
            "7.0        FAILED       01:01:01",
        ],
    ),
    "--parsable2: fields joined by |, no padding": (
        [Acct(job_id=7, exit_code=3, state="FAILED")],
        "jobid,state,exitcode,nodelist",
        True,
        "|",
        ["JobID|State|ExitCode|NodeList", "7|FAILED|3:0|node[01-02]"],
    ),
    "a memory check's --format: what Muster records, and empty what it does not": (
        [Acct(job_id=7, gpus=8)],
        "JobID,MaxRSS,AllocTRES,ElapsedRaw,AllocCPUS,AveVMSize",
        True,
        "|",
        ["JobID|MaxRSS|AllocTRES|ElapsedRaw|AllocCPUS|AveVMSize", "7||gres/gpu=8,node=2|3661|2|"],
    ),
    "CPU time used, and allocated (CPUs x elapsed)": (
        [
            Acct(job_id=7, cpus=16, cpu_usec=83_456_789),
            Acct(job_id=8, cpus=2, cpu_usec=7_384_000_000, nodes=("node01",)),
            Acct(job_id=9, cpus=1, nodes=("node01",)),
        ],
        "JobID,TotalCPU,CPUTime,CPUTimeRAW",
        True,
        "|",
        [
            "JobID|TotalCPU|CPUTime|CPUTimeRAW",
            "7|01:23.456|16:16:16|58576",
            "8|02:03:04|02:02:02|7322",
            "9||01:01:01|3661",
        ],
    ),
    "sizing --mem: what was asked, the peak and where; a step's own are not recorded": (
        [
            Acct(job_id=7, mem_mib=40960, cpus=16, max_rss_bytes=3 * 2**30, max_rss_node="node02"),
            Acct(job_id=7, step=0, cpus=0),
            Acct(job_id=8, mem_mib=1500, cpus=1, nodes=("node01",)),
            Acct(job_id=9, cpus=1, nodes=("node01",)),
        ],
        "JobID,ReqMem,MaxRSS,MaxRSSNode,NCPUS,ReqCPUS",
        True,
        "|",
        [
            "JobID|ReqMem|MaxRSS|MaxRSSNode|NCPUS|ReqCPUS",
            "7|40G|3145728K|node02|16|16",
            "7.0|||||",
            "8|1500M|||1|1",
            "9|0|||1|1",
        ],
    ),
}


def test_sbatch_test_only_says_what_would_be_accepted() -> None:
    spec = {"nodes_min": 2, "nodes_max": 4, "gpus_per_node": 8, "partition": "gpu",
            "time_limit_s": 5400}  # fmt: skip
    assert checked_line(spec) == (
        "sbatch: Job would be accepted: 2-4 node(s), 8 GPU(s) per node, in partition gpu,"
        " time limit 1:30:00 (--test-only: nothing was submitted)"
    )
    total = checked_line(spec | {"nodes_max": 2, "gpus_total": 12})
    assert "2 node(s), 12 GPU(s) in all," in total


def test_the_fields_muster_does_not_record_are_named() -> None:
    assert unrecorded("JobID,MaxRSS%12,elapsed,aveRSS,UserCPU") == ["AveRSS", "UserCPU"]
    assert unrecorded(None) == []


@pytest.mark.parametrize(("rows", "fmt", "header", "delimiter", "want"), SACCT.values(),
                         ids=SACCT.keys())  # fmt: skip
def test_sacct(
    rows: list[Acct], fmt: str | None, header: bool, delimiter: str | None, want: list[str]
) -> None:
    assert sacct_lines(rows, fmt, header, delimiter) == want


COMPRESS = {
    "a run of numbers": (("node01", "node02", "node03"), "node[01-03]"),
    "gaps make several ranges": (("n1", "n2", "n4", "n7", "n8"), "n[1-2,4,7-8]"),
    "one node stays as it is": (("gpu7",), "gpu7"),
    "names without numbers and other prefixes sort beside them": (
        ("login", "b01", "a01", "a02"),
        "a[01-02],b01,login",
    ),
    "nothing": ((), ""),
}


@pytest.mark.parametrize(("names", "want"), COMPRESS.values(), ids=COMPRESS.keys())
def test_compress(names: tuple[str, ...], want: str) -> None:
    assert compress(names) == want


DURATION = {
    "under an hour: M:SS": (59.0, "0:59"),
    "hours": (3725.0, "1:02:05"),
    "days": (90061.0, "1-01:01:01"),
    "nothing yet": (0.0, "0:00"),
}


@pytest.mark.parametrize(("seconds", "want"), DURATION.values(), ids=DURATION.keys())
def test_duration(seconds: float, want: str) -> None:
    assert duration(seconds) == want


def test_squeue_steps() -> None:
    from types import SimpleNamespace

    from muster.slurm_format import step_lines

    jobs = [job(job_id=12, partition="gpu", user="ada")]
    steps = [
        SimpleNamespace(job_id=12, step_id=0, argv=("/usr/bin/python3", "t.py"), nodes=("n1", "n2"),
                        ntasks=16, started_at=1000.0),
        SimpleNamespace(job_id=99, step_id=0, argv=("x",), nodes=(), ntasks=1, started_at=0.0),
    ]  # fmt: skip
    assert step_lines(steps, jobs, None, True, now=1075.0) == [
        "         STEPID     NAME PARTITION     USER      TIME NODELIST",
        "           12.0  python3       gpu      ada      1:15 n[1-2]",
    ]
    assert step_lines(steps, jobs, "%i %A", False, now=1075.0) == ["12.0 16"]


def test_sinfo_s_summarizes_each_partition() -> None:
    """`sinfo -s`: a line per partition, its nodes allocated / idle / other / total."""
    nodes = [node("node01"), node("node02", free=0), node("node03", state="DRAINED")]
    lines = sinfo_lines(nodes, None, False, True, ("normal",), "normal", {}, summarize=True)
    assert lines == [
        "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T) NODELIST",
        "normal*      up   infinite          1/1/1/3 node[01-03]",
        "debug        up   infinite          1/0/0/1 node02",  # the helper's busy node
    ]


def test_sinfo_l_gives_slurms_long_columns_and_each_partitions_job_size() -> None:
    nodes = [node("node01", partitions=("normal", "debug")), node("node02", free=0)]
    lines = sinfo_lines(
        nodes, None, False, True, ("normal", "debug"), "normal", {}, long=True,
        max_nodes={"normal": 8},
    )  # fmt: skip
    assert lines == [
        "PARTITION AVAIL  TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       STATE"
        " NODELIST",
        "normal*      up   infinite        1-8   no       NO        all      1        idle node01",
        "normal*      up   infinite        1-8   no       NO        all      1   allocated node02",
        "debug        up   infinite 1-infinite   no       NO        all      1        idle node01",
        "debug        up   infinite 1-infinite   no       NO        all      1   allocated node02",
    ]
    sized = [replace(nodes[0], cpus=48, memory_mib=131072), replace(nodes[1], partitions=())]
    by_node = sinfo_lines(sized, None, True, True, ("normal",), "normal", {}, long=True)
    assert by_node == [
        "NODELIST  NODES PARTITION       STATE CPUS   MEMORY         GRES AVAIL_FE REASON",
        "node01      1   normal*        idle   48   131072   gpu:h100:4   (null) none",
        "node01      1     debug        idle   48   131072   gpu:h100:4   (null) none",
        "node02      1    (null)   allocated  N/A      N/A   gpu:h100:4   (null) none",
    ]  # node02's agent did not say its size


def test_squeue_l_gives_slurms_long_columns_and_the_time_read() -> None:
    lines = squeue_lines([job(state="RUNNING", nodelist=("node01",))], SQUEUE_LONG, None, True)
    assert lines[0].split() == [
        "JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "TIME_LIMI", "NODES",
        "NODELIST(REASON)",
    ]  # fmt: skip
    assert lines[1].split()[4] == "RUNNING"
    assert long_header(0.0).endswith(" 1970")


@pytest.mark.parametrize(
    ("asked", "states"),
    [
        (["R"], ("RUNNING", "PREEMPTING")),  # a job in its preemption grace still runs
        (["pd", "R"], ("PENDING", "RUNNING", "PREEMPTING")),
        (["CF"], ("CONFIGURING", "STARTING")),
        (["running", "CD"], ("RUNNING", "COMPLETED")),
        (["all"], ()),
    ],
)
def test_squeue_t_takes_slurms_codes(asked: list[str], states: tuple[str, ...]) -> None:
    """`squeue -t R`: every state squeue shows as R. Before, the code table was read
    backwards and R meant PREEMPTING alone: `squeue -t R` listed no running job."""
    assert state_filter(asked) == (states, asked == ["all"])


UNMET = {
    "no dependency": ("", "DEPENDENCY", "(null)"),
    "each job of each term, marked": (
        "afterok:12:13,afterany:14", "DEPENDENCY",
        "afterok:12(unfulfilled),afterok:13(unfulfilled),afterany:14(unfulfilled)",
    ),
    "any one enough keeps its ?": (
        "afterok:1?afternotok:2", "DEPENDENCY", "afterok:1(unfulfilled)?afternotok:2(unfulfilled)"
    ),
    "one that can never be met": ("afterok:7", "DEPENDENCY_NEVER_SATISFIED", "afterok:7(failed)"),
    "a singleton": ("singleton", "SINGLETON", "singleton(unfulfilled)"),
}  # fmt: skip


@pytest.mark.parametrize(("given", "reason", "want"), UNMET.values(), ids=UNMET.keys())
def test_squeue_E_shows_what_a_job_still_waits_on(given: str, reason: str, want: str) -> None:
    view = job(state="PENDING", reason=reason, dependency=given)
    assert unmet(view) == want
    assert squeue_lines([view], "%i %E", None, False) == [f"{view.job_id} {want}"]


def test_the_dependency_is_asked_for_only_when_a_column_shows_it() -> None:
    assert asks_dependency("%i %.20E", None)
    assert asks_dependency(None, "JobID,Dependency:30")
    assert not asks_dependency(None, None)  # squeue's default columns
    assert not asks_dependency("%i %Z", None)  # a bad format says so when rendered


def test_sinfo_R_lists_the_nodes_out_of_service_by_reason_who_and_when() -> None:
    at = 1_700_000_000.0
    when, later = stamp(at), stamp(at + 60)  # local time, as sinfo prints it
    nodes = [
        node("n1", state="DRAINED", reason="drained by ada: bad riser", state_since=at),
        node("n2", state="DRAINED", reason="drained by ada: bad riser", state_since=at + 0.4),
        node("n3", state="DOWN", reason="no heartbeat for 30 s", state_since=at + 60),
        node("n4", reason=""),  # in service: not listed
        node("n5", state="DRAINED", reason="drained by bob: fan", state_since=at),
    ]
    assert sinfo_lines(nodes, None, False, True, ("normal",), "normal", reasons=True) == [
        "REASON" + " " * 45 + "USER      TIMESTAMP           NODELIST",
        "bad riser" + " " * 42 + f"ada       {when} n[1-2]",
        "no heartbeat for 30 s" + " " * 30 + f"muster    {later} n3",
        "fan" + " " * 48 + f"bob       {when} n5",
    ]


def test_plain_sinfo_gives_nodes_that_show_differently_lines_of_their_own() -> None:
    nodes = [
        node("n1", state="DRAINED", reason="drained by ada: riser"),
        node("n2", state="DRAINED", reason="drained by ada: fan"),
        node("n3", state="DRAINED", reason="drained by ada: riser"),
    ]
    lines = sinfo_lines(nodes, "%N %E %u", False, False, ("normal",), "normal")
    assert lines == ["n[1,3] riser ada", "n2 fan ada"]


def test_sacct_lists_jobs_oldest_first_each_with_its_steps_after_it() -> None:
    rows = [Acct(job_id=9), Acct(job_id=9, step=0), Acct(job_id=7), Acct(job_id=7, attempt=1)]
    assert [(r.job_id, r.step, r.attempt) for r in oldest_first(rows)] == [
        (7, None, None), (7, None, 1), (9, None, None), (9, 0, None)
    ]  # fmt: skip


SORTS = {
    "-i: job ids down, as numbers": ("-i", [10, 9, 2]),
    "t,-i: state, then ids down": ("t,-i", [10, 2, 9]),  # PD before R
    "+V: submitted first first": ("+V", [9, 2, 10]),
}


@pytest.mark.parametrize(("keys", "want"), SORTS.values(), ids=SORTS.keys())
def test_squeue_S_sorts_by_format_letters(keys: str, want: list[int]) -> None:
    jobs = [
        job(job_id=9, state="RUNNING", submitted_at=1.0),
        job(job_id=10, state="PENDING", submitted_at=3.0),
        job(job_id=2, state="PENDING", submitted_at=2.0),
    ]
    assert [j.job_id for j in sort_jobs(jobs, keys)] == want


def test_squeue_S_names_the_letters_it_knows() -> None:
    with pytest.raises(FormatError, match="unknown sort field 'Z'"):
        sort_jobs([job()], "Z")


def test_sinfo_T_a_line_per_reservation() -> None:
    at = 1_700_000_000.0
    views = [
        ReservationView(name="llm", start=at, end=at + 600, nodes=("n1", "n2")),
        ReservationView(name="big", start=at + 9_000, end=at + 12_600, gpus=16),
    ]
    lines = reservation_table(views, at + 60, header=True)
    assert [line.split() for line in lines] == [
        ["RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION", "NODELIST"],
        ["llm", "ACTIVE", stamp(at), stamp(at + 600), "10:00", "n[1-2]"],
        ["big", "INACTIVE", stamp(at + 9_000), stamp(at + 12_600), "1:00:00", "(16", "GPUs)"],
    ]


def test_sinfo_C_counts_cpus_allocated_idle_other_and_total() -> None:
    nodes = [
        node("n1", cpus=32, cpus_alloc=8),
        node("n2", cpus=32, cpus_alloc=40),  # asked more than it has: all of it
        node("n3", state="DRAINED", cpus=16, cpus_alloc=4),  # out of service: other
        node("n4"),  # an agent that did not say: not counted
    ]
    assert sinfo_lines(nodes, "%C", False, False, ("normal",), "normal", summarize=True) == [
        "40/24/16/80"
    ]
    by_node = sinfo_lines(nodes, "%N %C", True, False, ("normal",), "normal")
    assert by_node == ["n1 8/24/0/32", "n2 32/0/0/32", "n3 0/0/16/16", "n4 N/A"]
