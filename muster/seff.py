"""Pure core of the `seff` shim (muster/shims.py): how much of what a job asked it used,
in the lines of Slurm's contributed `seff` script, from its accounting record.

    seff JOBID

Memory is what Muster counts (the placer holds a job's `--mem` on each of its nodes),
so it is what a user right-sizes: `Memory Utilized` is the highest peak of the job's
cgroup on one node (sacct's MaxRSS), times its nodes with `(estimated maximum)` as
Slurm's says when there are several; `Memory Efficiency` is that against `--mem` times
its nodes. `CPU Utilized` is the CPU time of its cgroups on every node (TotalCPU), and
`CPU Efficiency` that against its CPUs times its wall-clock time (`core-walltime`).
"""

from __future__ import annotations

from typing import Any

from muster.slurm_format import clock

_UNITS = ("KB", "MB", "GB", "TB", "PB")


def size_words(kib: float) -> str:
    """KiB as seff writes them: the largest unit the value is at least one of, with two
    decimals (`1.50 GB`, `512.00 MB`, `0.00 MB` for nothing)."""
    if kib <= 0:
        return "0.00 MB"
    unit = 0
    while kib >= 1024 and unit < len(_UNITS) - 1:
        kib /= 1024
        unit += 1
    return f"{kib:.2f} {_UNITS[unit]}"


def seff_lines(row: Any, group: str, cluster: str, now: float) -> list[str]:
    """The report for one job's record (fairshare's AcctRow: its state, nodes, CPUs,
    `--mem`, memory peak); `group` is the owner's group, `now` the time for a job that
    has not ended."""
    nodes = max(1, len(row.nodes))
    ended = row.end if row.end is not None else now
    wall = 0.0 if row.start is None else max(0.0, ended - row.start)
    state = row.state if row.exit_code is None else f"{row.state} (exit code {row.exit_code})"
    lines = [
        f"Job ID: {row.job_id}",
        f"Cluster: {cluster}",
        f"User/Group: {row.user}/{group}",
        f"State: {state}",
        f"Nodes: {nodes}",
        f"Cores per node: {row.cpus // nodes if row.cpus else 1}",
        *_cpu(row, wall),
        f"Job Wall-clock time: {clock(int(wall))}",
        *_memory(row, nodes),
    ]
    if row.state in ("RUNNING", "STARTING", "RESTARTING"):
        lines.append("WARNING: Efficiency statistics may be misleading for RUNNING jobs.")
    return lines


def _cpu(row: Any, wall: float) -> list[str]:
    """CPU time used (its cgroups' on every node) against its CPUs times its wall time."""
    if row.cpu_usec is None:
        used = "not recorded (no cgroup on its nodes, or it has not ended)"
        return [f"CPU Utilized: {used}", "CPU Efficiency: not known"]
    cores = int(wall) * max(1, row.cpus)
    share = 100 * row.cpu_usec / 1e6 / cores if cores else 0.0
    return [
        f"CPU Utilized: {clock(row.cpu_usec // 1_000_000)}",
        f"CPU Efficiency: {share:.2f}% of {clock(cores)} core-walltime",
    ]


def _memory(row: Any, nodes: int) -> list[str]:
    if row.max_rss_bytes is None:
        used = "not recorded (no memory cgroup on its nodes, or it has not ended)"
        return [f"Memory Utilized: {used}", "Memory Efficiency: not known"]
    kib = row.max_rss_bytes / 1024 * nodes
    estimated = " (estimated maximum)" if nodes > 1 else ""
    lines = [f"Memory Utilized: {size_words(kib)}{estimated}"]
    if not row.mem_mib:
        lines.append("Memory Efficiency: not known (no --mem asked)")
        return lines
    asked = row.mem_mib * 1024 * nodes
    share = 100 * kib / asked
    lines.append(f"Memory Efficiency: {share:.2f}% of {size_words(asked)}")
    return lines
