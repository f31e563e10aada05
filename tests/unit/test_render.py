"""`muster.render`: API replies -> the lines `muster queue`, `show` and `nodes` print."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from muster.render import (
    hms,
    nodes_lines,
    partition_lines,
    queue_lines,
    reservation_lines,
    show_lines,
)
from shared.api import (
    AttemptView,
    GpuView,
    JobView,
    NodesReply,
    NodeView,
    PartitionView,
    QueueReply,
    ReservationView,
    ShowJobReply,
)


def job(**kw: object) -> JobView:
    base: dict[str, object] = dict(
        job_id=42, name="pretrain-llama", user="alice", account="ml", partition="gpu",
        qos="normal", state="RUNNING", reason="", nodes=2, gpus=16,
        nodelist=("node01", "node02"), submitted_at=1_700_000_000.0,
        started_at=1_700_000_060.0, ended_at=None, time_limit_s=7200, elapsed_s=3725.0,
        exit_code=None, restart_count=1,
    )  # fmt: skip
    return JobView(**(base | kw))  # type: ignore[arg-type]


HMS = {
    "under an hour keeps the hour": (59.9, "0:00:59"),
    "hours and minutes": (3725.0, "1:02:05"),
    "past a day gets a day prefix": (90061.0, "1-1:01:01"),
}


@pytest.mark.parametrize(("seconds", "want"), HMS.values(), ids=HMS.keys())
def test_hms(seconds: float, want: str) -> None:
    assert hms(seconds) == want


HEAD = "  JOBID PARTITION  NAME         USER     STATE             TIME NODES GPUS  "
QUEUE = {
    "a running job lists its nodes": (
        job(),
        [
            HEAD + "REASON/NODELIST",
            "     42 gpu        pretrain-lla alice    RUNNING        1:02:05     2   16"
            "  node01,node02",
        ],
    ),
    "a pending job shows why it waits": (
        job(state="PENDING", reason="PRIORITY", nodelist=(), elapsed_s=0.0),
        [
            HEAD + "REASON/NODELIST",
            "     42 gpu        pretrain-lla alice    PENDING        0:00:00     2   16"
            "  (PRIORITY)",
        ],
    ),
    "a job stopping its workers still lists its nodes": (
        job(state="COMPLETING"),
        [
            HEAD + "REASON/NODELIST",
            "     42 gpu        pretrain-lla alice    COMPLETING     1:02:05     2   16"
            "  node01,node02",
        ],
    ),
}


@pytest.mark.parametrize(("view", "want"), QUEUE.values(), ids=QUEUE.keys())
def test_queue_lines(view: JobView, want: list[str]) -> None:
    assert queue_lines(QueueReply(jobs=(view,))) == want


def test_queue_start_column_says_n_a_without_an_estimate() -> None:
    lines = queue_lines(QueueReply(jobs=(job(state="PENDING"),)), start=True)
    assert lines[0].endswith("START_TIME") and lines[1].endswith("  N/A")


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Times print in local time, as scontrol's do: UTC here, whatever the machine's."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_show_lines_name_every_attempt_and_the_priority(utc: None) -> None:
    attempt = AttemptView(
        attempt=1, seq=2, nodes=("node01", "node03"), world_size=16, reason="xid 79 on node02",
        outcome="shrink", started_at=1_700_000_060.0, ended_at=1_700_000_160.5,
    )  # fmt: skip
    reply = ShowJobReply(
        job=job(array_job_id=40, array_task_id=2),
        spec={"ntasks_per_node": 4, "cpus_per_task": 4, "mem_mib": 65536},
        attempts=(attempt,),
        priority={"total": 1234.4, "age": 34.0, "fairshare": 1200.4},
        dependency="afterok:12",
    )
    assert show_lines(reply, (1001, "ml", 2001)) == [
        "JobId=42 JobName=pretrain-llama UserId=alice(1001) GroupId=ml(2001) Account=ml",
        "   JobState=RUNNING Reason=None ExitCode=0:0 Restarts=1",
        "   Partition=gpu QOS=normal NumNodes=2 GPUs=16 TimeLimit=2:00:00 RunTime=1:02:05",
        "   NodeList=node01,node02",
        "   NumTasks=8 CPUs/Task=4 MinMemoryNode=65536M",
        "   StartTime=2023-11-14T22:14:20 EndTime=2023-11-15T00:14:20",
        "   ArrayJobId=40 ArrayTaskId=2",
        "   Dependency=afterok:12",
        "   Priority=1234 (age=34 fairshare=1200)",
        "   Attempt 1.2: nodes=node01,node03 world_size=16 reason=xid 79 on node02"
        " outcome=shrink (100.5s)",
    ]


def test_show_lines_name_the_batch_host_of_a_script_on_the_first_node_only() -> None:
    first = ShowJobReply(job=job(), spec={"batch_first_node": True})
    assert show_lines(first)[3] == "   NodeList=node01,node02 BatchHost=node01"
    pending = ShowJobReply(job=job(state="PENDING", nodelist=()), spec={"batch_first_node": True})
    assert show_lines(pending)[3] == "   NodeList=(null)"


def test_show_lines_give_what_the_job_used_as_sacct_names_it() -> None:
    used = ShowJobReply(
        job=job(), spec={}, max_rss_bytes=3 * 2**30, max_rss_node="node02", cpu_usec=83_456_789
    )
    assert "   MaxRSS=3145728K MaxRSSNode=node02 TotalCPU=01:23.456" in show_lines(used)
    cpu_only = ShowJobReply(job=job(), spec={}, cpu_usec=1_000)
    assert "   TotalCPU=00:00.001" in show_lines(cpu_only)
    nothing = show_lines(ShowJobReply(job=job(), spec={}))
    assert not [line for line in nothing if "MaxRSS" in line or "TotalCPU" in line]


SHOW_REASON = {
    "a hold by its owner has Slurm's name": ("PENDING", "HELD", "JobHeldUser", None),
    "a hold by an operator has Slurm's name": ("PENDING", "HELD_ADMIN", "JobHeldAdmin", None),
    "a wait by Slurm's name": ("PENDING", "PRIORITY", "Priority", None),
    "a reason Slurm has no name for stays": ("PENDING", "TOPOLOGY", "TOPOLOGY", None),
    "a requeued wait's detail is a line of its own": (
        "PENDING", "PRIORITY (requeued: xid 79)", "Priority", "Priority (requeued: xid 79)",
    ),
    "an ended job's sentence is a line of its own": (
        "COMPLETED", "all 2 workers exited 0", "None", "all 2 workers exited 0",
    ),
    "a failed job reads as Slurm's code": (
        "FAILED", "worker 1 on node02 exited 3", "NonZeroExitCode", "worker 1 on node02 exited 3",
    ),
    "no reason is None": ("RUNNING", "", "None", None),
}  # fmt: skip


@pytest.mark.parametrize(
    ("state", "reason", "want", "detail"), SHOW_REASON.values(), ids=SHOW_REASON.keys()
)
def test_show_lines_name_the_reason_in_one_word_as_scontrol_does(
    state: str, reason: str, want: str, detail: str | None
) -> None:
    lines = show_lines(ShowJobReply(job=job(state=state, reason=reason, exit_code=3), spec={}))
    assert lines[1] == f"   JobState={state} Reason={want} ExitCode=3:0 Restarts=1"
    details = [line for line in lines if line.startswith("   Detail: ")]
    assert details == ([] if detail is None else [f"   Detail: {detail}"])


def test_show_lines_name_the_user_alone_where_this_machine_has_no_account_of_them() -> None:
    lines = show_lines(ShowJobReply(job=job(), spec={}))
    assert lines[0] == "JobId=42 JobName=pretrain-llama UserId=alice Account=ml"


def _part_node(name: str, parts: tuple[str, ...]) -> NodeView:
    return NodeView(
        name=name, state="UP", reason="", gpus_total=8, gpus_free=8, topology=(),
        last_heartbeat=None, last_fault=None, partitions=parts,
    )  # fmt: skip


PART_NODES = (
    _part_node("node01", ("gpu", "debug")), _part_node("node02", ("gpu",)),
    _part_node("node03", ("debug",)),
)  # fmt: skip


def test_partition_lines_show_the_partitions_policy_nodes_and_gpus() -> None:
    gpu = PartitionView(
        name="gpu", default_time_s=3600, max_time_s=86400, max_nodes=8, allowed_accounts=("ml",),
        default_qos="normal", priority_tier=2, requires_approval=True, def_mem_per_gpu_mib=16384,
    )  # fmt: skip
    reply = NodesReply(
        nodes=PART_NODES, partitions=("gpu", "debug"), default_partition="gpu",
        partition_views=(gpu, PartitionView(name="debug", default_time_s=600)),
    )  # fmt: skip
    assert partition_lines(reply, "gpu") == [
        "PartitionName=gpu",
        "   AllowAccounts=ml AllowQos=ALL Default=YES QoS=normal",
        "   DefaultTime=1:00:00 MaxNodes=8 MaxTime=1-00:00:00 MaxGPUsPerJob=UNLIMITED",
        "   PriorityTier=2 PreemptMode=REQUEUE RequiresApproval=YES",
        "   DefMemPerGPU=16384",
        "   Nodes=node[01-02]",
        "   State=UP TotalNodes=2 TotalGPUs=16 TRES=node=2,gres/gpu=16",
    ]
    assert partition_lines(reply, "debug")[1:6] == [
        "   AllowAccounts=ALL AllowQos=ALL Default=NO QoS=N/A",
        "   DefaultTime=10:00 MaxNodes=UNLIMITED MaxTime=UNLIMITED MaxGPUsPerJob=UNLIMITED",
        "   PriorityTier=0 PreemptMode=REQUEUE RequiresApproval=NO",
        "   DefMemPerNode=UNLIMITED",
        "   Nodes=node[01,03]",
    ]


def test_partition_lines_without_a_config_show_no_limit() -> None:
    reply = NodesReply(nodes=PART_NODES[:2], partitions=("gpu",), default_partition="gpu")
    assert partition_lines(reply, "gpu") == [
        "PartitionName=gpu",
        "   AllowAccounts=ALL AllowQos=ALL Default=YES",
        "   MaxNodes=UNLIMITED MaxTime=UNLIMITED",
        "   Nodes=node[01-02]",
        "   State=UP TotalNodes=2 TotalGPUs=16 TRES=node=2,gres/gpu=16",
    ]


def test_nodes_lines_show_free_gpus_and_the_unhealthy_ones() -> None:
    gpus = (
        GpuView(index=0, model="H100", healthy=True, allocated_to=42, last_xid=None),
        GpuView(index=1, model="H100", healthy=False, allocated_to=None, last_xid=79),
    )
    node = NodeView(
        name="node02", state="DRAINING", reason="xid 79", gpus_total=2, gpus_free=0,
        topology=("spine0", "leaf1"), last_heartbeat=None, last_fault=None, gpus=gpus,
        features=("ib", "rack1"), gpu_type="h100",
    )  # fmt: skip
    assert nodes_lines(NodesReply(nodes=(node,))) == [
        "NODE       STATE          GPUS TOPOLOGY       GRES         FEATURES       UNHEALTHY"
        "    REASON",
        "node02     DRAINING        0/2 spine0/leaf1   gpu:h100:2   ib,rack1       1(xid79)"
        "     xid 79",
    ]


def test_show_lines_give_the_predicted_end_beside_the_limit_and_why(utc: None) -> None:
    why = "mean of the last 2 jobs of alice named pretrain on 16 GPUs"
    reply = ShowJobReply(job=job(), spec={}, predicted_end=1_700_004_000.0, predicted_why=why)
    assert show_lines(reply)[5:] == [
        "   StartTime=2023-11-14T22:14:20 EndTime=2023-11-15T00:14:20",
        f"   PredictedEnd=2023-11-14T23:20:00 ({why}; the limit still ends it)",
    ]


def test_a_pending_job_shows_its_estimated_start(utc: None) -> None:
    pending = job(state="PENDING", started_at=None, estimated_start=1_700_004_000.0)
    assert show_lines(ShowJobReply(job=pending, spec={}))[5:] == [
        "   StartTime=2023-11-14T23:20:00 (estimated)"
    ]


def test_a_pending_job_shows_when_it_may_start(utc: None) -> None:
    """scontrol's EligibleTime: the --begin (or StartTime= update) of a job not started."""
    pending = job(state="PENDING", started_at=None)
    reply = ShowJobReply(job=pending, spec={"begin_at": 1_700_004_000.0})
    assert show_lines(reply)[5:] == ["   EligibleTime=2023-11-14T23:20:00"]
    assert "EligibleTime" not in "".join(show_lines(ShowJobReply(job=job(), spec={})))


def test_show_lines_say_where_the_jobs_output_goes(utc: None) -> None:
    """scontrol's SubmitTime, WorkDir, StdOut and StdErr: the patterns expanded, a
    relative path under the job's folder, as scripts that find a job's log read them."""
    spec = {"workdir": "/home/alice/run", "output": "logs/%x-%j.out", "error": "/tmp/%u.err"}
    lines = show_lines(ShowJobReply(job=job(), spec=spec))
    assert lines[-1] == (
        "   SubmitTime=2023-11-14T22:13:20 WorkDir=/home/alice/run"
        " StdOut=/home/alice/run/logs/pretrain-llama-42.out StdErr=/tmp/alice.err"
    )
    task = show_lines(ShowJobReply(job=job(array_job_id=40, array_task_id=2), spec=spec | {
        "output": None, "error": None}))  # fmt: skip
    assert task[-1].endswith(
        "StdOut=/home/alice/run/slurm-40_2.out StdErr=/home/alice/run/slurm-40_2.out"
    )


def test_reservation_lines_show_its_window_what_it_holds_and_whether_open(utc: None) -> None:
    patch = ReservationView(
        name="patch", start=1_700_000_000.0, end=1_700_007_200.0, recurrence="weekly",
        maintenance=True, accounts=("research",),
    )  # fmt: skip
    assert reservation_lines(patch, now=1_700_000_100.0) == [
        "ReservationName=patch StartTime=2023-11-14T22:13:20 EndTime=2023-11-15T00:13:20"
        " Duration=2:00:00",
        "   Nodes=ALL NodeCnt=N/A GPUs=N/A Flags=MAINT,WEEKLY",
        "   Accounts=(null) State=ACTIVE",  # nobody runs inside maintenance
    ]
    run = ReservationView(
        name="llm", start=1_700_000_000.0, end=1_700_000_600.0, nodes=("n1", "n2"),
        accounts=("research",),
    )  # fmt: skip
    assert reservation_lines(run, now=1_699_000_000.0)[1:] == [
        "   Nodes=n[1-2] NodeCnt=2 GPUs=N/A Flags=(null)",
        "   Accounts=research State=INACTIVE",
    ]
