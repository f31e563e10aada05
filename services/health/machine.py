"""What a node has besides its GPUs: its CPUs and memory, as its agent announces them
at registration (sinfo's CPUS and MEMORY; admission and the placer fit --mem and
--cpus-per-task to them). Settings may say otherwise (MUSTER_CPUS, MUSTER_MEMORY_MIB:
a simulated node smaller than the machine it runs on)."""

from __future__ import annotations

import os
from pathlib import Path


def meminfo_mib(text: str) -> int:
    """`MemTotal:  24576000 kB` of /proc/meminfo in MiB; 0 when it is not there."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            words = value.split()
            if words and words[0].isdigit():
                return int(words[0]) // 1024
    return 0


def machine_size(
    cpus: int, memory_mib: int, meminfo: Path = Path("/proc/meminfo")
) -> tuple[int, int]:
    """(CPUs, memory in MiB): those given, else the machine's (the CPUs this process
    may run on, as a cgroup-limited container sees them); 0 where none can be read."""
    if not cpus:
        cpus = len(os.sched_getaffinity(0))
    if not memory_mib:
        try:
            memory_mib = meminfo_mib(meminfo.read_text())
        except OSError:
            memory_mib = 0
    return cpus, memory_mib
