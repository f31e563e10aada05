"""Pure: API replies -> the text the `muster` commands print (squeue/scontrol-like).

No I/O: each function returns the lines; the command modules print them. Times shown
as dates use the local time zone, as squeue does.
"""

from __future__ import annotations

import time

from muster.slurm_format import compress, cpu_time, limit, reason, reason_text

TYPE_CHECKING = False  # mypy takes it as true; the lean `muster queue` (muster.lean) prints
if TYPE_CHECKING:  # with this module, and these imports cost it more than its own work
    from typing import Any

    from shared.api import (
        JobView,
        NodesReply,
        NodeView,
        PartitionView,
        QueueReply,
        ReservationView,
        ShowJobReply,
    )

# shared.states.LIVE_RUN by name (its enum module costs a `muster queue` call more than
# its own work); tests/unit/cli/test_lean.py holds the two equal
LIVE_RUN = frozenset({"STARTING", "RUNNING", "COMPLETING"})

QUEUE_COLUMNS = "{:>7} {:<10} {:<12} {:<8} {:<11} {:>10} {:>5} {:>4}  {}"
NODE_COLUMNS = "{:<10} {:<9} {:>9} {:<14} {:<12} {:<14} {:<12} {}"


def to_json(value: Any) -> str:
    """What `--json` prints: the reply's fields, sorted, indented."""
    import json  # only --json pays for them: a one-shot command's imports are its cost

    import msgspec

    return json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True)


def hms(seconds: float) -> str:
    """Slurm's duration: `H:MM:SS`, or `D-H:MM:SS` past a day."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    text = f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def _stamp(at: float) -> str:
    """Local time as scontrol prints it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(at))


def _where(job: JobView, start: bool) -> str:
    """The last column: the estimated start, the nodes of a live job, or the reason."""
    if start:
        if not job.estimated_start:
            return "N/A"
        return _stamp(job.estimated_start)
    return ",".join(job.nodelist) if job.state in LIVE_RUN else f"({job.reason})"


def queue_lines(reply: QueueReply, start: bool = False) -> list[str]:
    """`muster queue`: one header, one line per job."""
    last = "START_TIME" if start else "REASON/NODELIST"
    head = ("JOBID", "PARTITION", "NAME", "USER", "STATE", "TIME", "NODES", "GPUS", last)
    lines = [QUEUE_COLUMNS.format(*head)]
    for j in reply.jobs:
        row = (j.job_id, j.partition[:10], j.name[:12], j.user[:8], j.state, hms(j.elapsed_s))
        lines.append(QUEUE_COLUMNS.format(*row, j.nodes, j.gpus, _where(j, start)))
    return lines


def _batch_host(reply: ShowJobReply) -> str:
    """` BatchHost=NODE` where the script runs on the first node alone (sbatch's), as
    scontrol shows it; "" where it runs on every node or the job has no nodes."""
    if not reply.spec.get("batch_first_node") or not reply.job.nodelist:
        return ""
    return f" BatchHost={reply.job.nodelist[0]}"


def _tasks(reply: ShowJobReply) -> str:
    """`   NumTasks=8 CPUs/Task=4 MinMemoryNode=16384M`: what the job asks of each node
    besides GPUs, as scontrol shows it (`0` memory: no --mem, all of the node's)."""
    spec, j = reply.spec, reply.job
    per_node = int(spec.get("ntasks_per_node") or 1)
    cpus = int(spec.get("cpus_per_task") or 1)
    mib = int(spec.get("mem_mib") or 0)
    return f"   NumTasks={per_node * j.nodes} CPUs/Task={cpus} MinMemoryNode={mib}M"


def _files(reply: ShowJobReply) -> str:
    """` WorkDir=... StdOut=... StdErr=...`, as scontrol shows them (the patterns
    expanded, relative ones under the job's folder) for scripts that find a job's log
    so; nothing of a spec that says none."""
    import os

    from shared.outputs import default_output, expand_pattern

    spec, j = reply.spec, reply.job
    workdir = spec.get("workdir")
    if not isinstance(workdir, str):
        return ""
    out = spec.get("output") or default_output(j.array_task_id is not None)
    err = spec.get("error") or out
    node = j.nodelist[0] if j.nodelist else ""

    def path(pattern: str) -> str:
        text = expand_pattern(
            pattern, j.job_id, j.name, j.user, node, j.array_job_id, j.array_task_id
        )
        return os.path.join(workdir, text)  # an absolute one stays as it is

    return f" WorkDir={workdir} StdOut={path(str(out))} StdErr={path(str(err))}"


def user_ids(name: str, ids: tuple[int, str, int] | None) -> str:
    """`UserId=alice(1001) GroupId=ml(2001)` as scontrol shows them, from `ids` (the
    uid, group name and gid this machine knows the user by); the name alone without."""
    if ids is None:
        return f"UserId={name}"
    uid, group, gid = ids
    return f"UserId={name}({uid}) GroupId={group}({gid})"


def _used(reply: ShowJobReply) -> str:
    """`MaxRSS=3145728K MaxRSSNode=node02 TotalCPU=01:23.456`, as sacct names them, for a
    job whose workers exited with their cgroups' counters; "" otherwise."""
    words = []
    if reply.max_rss_bytes is not None:
        words.append(f"MaxRSS={reply.max_rss_bytes // 1024}K MaxRSSNode={reply.max_rss_node}")
    if reply.cpu_usec is not None:
        words.append(f"TotalCPU={cpu_time(reply.cpu_usec)}")
    return f"   {' '.join(words)}" if words else ""


def show_lines(reply: ShowJobReply, ids: tuple[int, str, int] | None = None) -> list[str]:
    """`muster show job`: scontrol's key=value lines, then one line per attempt. Each
    value is one word, as scripts split them: `Reason=` is Slurm's code (squeue's `%r`)
    and Muster's sentence, where it says more, is a `Detail:` line of its own;
    `ExitCode=` is Slurm's `CODE:SIGNAL`."""
    j = reply.job
    exit_code = j.exit_code or 0
    lines = [
        f"JobId={j.job_id} JobName={j.name} {user_ids(j.user, ids)} Account={j.account}",
        f"   JobState={j.state} Reason={reason(j)} ExitCode={exit_code}:0"
        f" Restarts={j.restart_count}",
        f"   Partition={j.partition} QOS={j.qos} NumNodes={j.nodes} GPUs={j.gpus}"
        f" TimeLimit={hms(j.time_limit_s)} RunTime={hms(j.elapsed_s)}",
        f"   NodeList={','.join(j.nodelist) or '(null)'}{_batch_host(reply)}",
        _tasks(reply),
    ]
    if j.started_at is not None:
        limit_end = j.ended_at if j.ended_at is not None else j.started_at + j.time_limit_s
        lines.append(f"   StartTime={_stamp(j.started_at)} EndTime={_stamp(limit_end)}")
    elif j.estimated_start:
        lines.append(f"   StartTime={_stamp(j.estimated_start)} (estimated)")
    if reply.predicted_end is not None:
        lines.append(
            f"   PredictedEnd={_stamp(reply.predicted_end)} ({reply.predicted_why};"
            " the limit still ends it)"
        )
    if used := _used(reply):
        lines.append(used)
    if j.array_job_id is not None:
        lines.append(f"   ArrayJobId={j.array_job_id} ArrayTaskId={j.array_task_id}")
    if reply.dependency:
        lines.append(f"   Dependency={reply.dependency}")
    begin = reply.spec.get("begin_at")
    if isinstance(begin, int | float) and j.started_at is None:  # --begin, StartTime=
        lines.append(f"   EligibleTime={_stamp(float(begin))}")
    if (detail := reason_text(j)) not in (reason(j), "None"):
        lines.append(f"   Detail: {detail}")
    if reply.approval:
        lines.append(f"   Approval: {reply.approval}")
    if reply.why_pending:
        lines.append(f"   Why pending: {reply.why_pending}")
    if reply.priority:
        parts = " ".join(f"{k}={v:.0f}" for k, v in sorted(reply.priority.items()) if k != "total")
        lines.append(f"   Priority={reply.priority.get('total', 0):.0f} ({parts})")
    if files := _files(reply):
        lines.append(f"   SubmitTime={_stamp(j.submitted_at)}{files}")
    for a in reply.attempts:
        ended = f"{a.ended_at - a.started_at:.1f}s" if a.ended_at else "running"
        lines.append(
            f"   Attempt {a.attempt}.{a.seq}: nodes={','.join(a.nodes)} world_size={a.world_size}"
            f" reason={a.reason} outcome={a.outcome or '-'} ({ended})"
        )
    for st in reply.steps:  # srun's steps (docs/steps.md), as sacct lists JOB.STEP
        code = "-" if st.exit_code is None else str(st.exit_code)
        held = ";".join(f"{n}:{','.join(map(str, g))}" for n, g in sorted(st.gpus.items()))
        lines.append(
            f"   Step {j.job_id}.{st.step_id}: {st.state} ExitCode={code}"
            f" NumTasks={st.ntasks} NodeList={','.join(st.nodes)}"
            + (f" GPUs={held}" if held else "")
            + f" Command={' '.join(st.argv)}"
        )
    return lines


def _default_memory(view: PartitionView) -> str:
    """Slurm's `DefMemPerGPU=` / `DefMemPerCPU=` (MiB), or `DefMemPerNode=UNLIMITED`
    where the partition gives a job without --mem none."""
    if view.def_mem_per_gpu_mib:
        return f"DefMemPerGPU={view.def_mem_per_gpu_mib}"
    if view.def_mem_per_cpu_mib:
        return f"DefMemPerCPU={view.def_mem_per_cpu_mib}"
    return "DefMemPerNode=UNLIMITED"


def partition_lines(reply: NodesReply, name: str) -> list[str]:
    """`scontrol show partition NAME`: who may use it, its limits and policy (its
    `PartitionView`; without a config, none), its nodes and GPUs. Its state is UP: Muster
    takes nodes out, not partitions (a job whose partition has no node up waits with
    reason PARTITION_DOWN)."""
    nodes = [n for n in reply.nodes if name in n.partitions]
    gpus = sum(n.gpus_total for n in nodes)
    default = "YES" if name == reply.default_partition else "NO"
    view = next((v for v in reply.partition_views if v.name == name), None)
    if view is None:
        policy = [
            f"   AllowAccounts=ALL AllowQos=ALL Default={default}",
            f"   MaxNodes=UNLIMITED MaxTime={limit(reply.time_limits.get(name, 0))}",
        ]
    else:
        policy = [
            f"   AllowAccounts={_all(view.allowed_accounts)} AllowQos={_all(view.allowed_qos)}"
            f" Default={default} QoS={view.default_qos or 'N/A'}",
            f"   DefaultTime={limit(view.default_time_s)} MaxNodes={_most(view.max_nodes)}"
            f" MaxTime={limit(view.max_time_s or 0)} MaxGPUsPerJob={_most(view.max_gpus_per_job)}",
            f"   PriorityTier={view.priority_tier} PreemptMode={view.preempt_mode.upper()}"
            f" RequiresApproval={'YES' if view.requires_approval else 'NO'}",
            f"   {_default_memory(view)}",
        ]
    return [
        f"PartitionName={name}",
        *policy,
        f"   Nodes={compress(n.name for n in nodes) or '(null)'}",
        f"   State=UP TotalNodes={len(nodes)} TotalGPUs={gpus}"
        f" TRES=node={len(nodes)},gres/gpu={gpus}",
    ]


def reservation_lines(view: ReservationView, now: float) -> list[str]:
    """`scontrol show reservation NAME`: its window open now or next, what it holds,
    who may run inside (nobody in a maintenance window), ACTIVE while open."""
    flags = ["MAINT"] * view.maintenance + [view.recurrence.upper()] * (view.recurrence != "none")
    # a GPU count's nodes are the placer's, each pass: (null), the GPUs say the size
    nodes = compress(view.nodes) if view.nodes else "(null)" if view.gpus else "ALL"
    state = "ACTIVE" if view.start <= now < view.end else "INACTIVE"
    accounts = "(null)" if view.maintenance else ",".join(view.accounts) or "(null)"
    return [
        f"ReservationName={view.name} StartTime={_stamp(view.start)}"
        f" EndTime={_stamp(view.end)} Duration={limit(int(view.end - view.start))}",
        f"   Nodes={nodes} NodeCnt={len(view.nodes) or 'N/A'} GPUs={view.gpus or 'N/A'}"
        f" Flags={','.join(flags) or '(null)'}",
        f"   Accounts={accounts} State={state}",
    ]


def _all(names: tuple[str, ...]) -> str:
    return ",".join(names) or "ALL"


def _most(value: int | None) -> str:
    return "UNLIMITED" if value is None else str(value)


def nodes_lines(reply: NodesReply) -> list[str]:
    """`muster nodes`: free/total GPUs, the switch path, and which GPUs are unhealthy."""
    head = ("NODE", "STATE", "GPUS", "TOPOLOGY", "GRES", "FEATURES", "UNHEALTHY", "REASON")
    lines = [NODE_COLUMNS.format(*head)]
    for n in reply.nodes:
        bad = ",".join(f"{g.index}(xid{g.last_xid})" for g in n.gpus if not g.healthy) or "-"
        link = (n.last_fault or {}).get("link") if n.state != "UP" else None
        bad = f"link:{link}" if link and bad == "-" else f"{bad},link:{link}" if link else bad
        gpus = f"{n.gpus_free}/{n.gpus_total}"
        lines.append(
            NODE_COLUMNS.format(
                n.name,
                n.state,
                gpus,
                "/".join(n.topology),
                _gres(n),
                ",".join(n.features) or "-",
                bad,
                n.reason,
            )
        )
    return lines


def _gres(n: NodeView) -> str:
    """Slurm's GRES column: `gpu:h100:4`, the GPU type and count a request names."""
    return f"gpu:{n.gpu_type}:{n.gpus_total}" if n.gpu_type else f"gpu:{n.gpus_total}"
