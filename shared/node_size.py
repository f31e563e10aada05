"""Pure: whether a node is big enough for a job's CPUs and memory on it.

A job's share of a node is its `--cpus-per-task` times `--ntasks-per-node` CPUs and its
`--mem` (per node; `--mem-per-gpu` and `--mem-per-cpu` are turned into it at admission).
A node announces its CPUs and memory when it registers (services/health/machine.py);
0 is "not known", which every job fits. Admission refuses a job no node of its partition
is big enough for; the placer puts a job only on nodes big enough for it, and counts
memory out as jobs hold it (services/placer/core/memory.py); CPUs stay a size.
"""

from __future__ import annotations

from shared.jobspec import JobSpec


def per_node(spec: JobSpec) -> tuple[int, int]:
    """(CPUs, memory in MiB) the job asks of each of its nodes; 0 MiB: no --mem, or
    `--mem=0` (all of each node's: `whole_memory`)."""
    return spec.cpus_per_task * spec.ntasks_per_node, spec.mem_mib or 0


def whole_memory(spec: JobSpec) -> bool:
    """`--mem=0`: Slurm's all of each node's memory (the placer counts it so)."""
    return spec.mem_mib == 0


def big_enough(have_cpus: int, have_mib: int, cpus: int, mib: int) -> bool:
    return (not have_cpus or cpus <= have_cpus) and (not have_mib or mib <= have_mib)
