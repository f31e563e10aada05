"""Pure core: what a job's cgroup looks like, as data.

`plan` turns a worker's limits into the control files to write, for cgroup v1 (one
hierarchy per controller) or v2 (one unified tree); the shell (`cgroups.py`) only
writes them. Parsers read what the kernel reports back (`/proc/<pid>/cgroup`, flat-keyed
files such as `memory.events`) into values. No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

CPU_PERIOD_US = 100_000
# cpuacct: the CPU time a job used (sacct's TotalCPU), where it is not mounted with cpu
V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices", "blkio")
V2_CONTROLLERS = ("memory", "cpu", "pids", "io")


class Version(StrEnum):
    V1 = "v1"
    V2 = "v2"


class DevNum(msgspec.Struct, frozen=True, kw_only=True):
    """A device number, as `stat` gives it for a device node."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}:{self.minor}"


class IoLimit(msgspec.Struct, frozen=True, kw_only=True):
    """Storage I/O for one job: a proportional weight and optional byte-rate caps."""

    weight: int | None = None  # 1..10000 on v2 (io.weight), 10..1000 on v1 (bfq)
    read_bps: int | None = None
    write_bps: int | None = None


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker may use on this node; None: not limited."""

    memory_bytes: int | None = None
    cpus: float | None = None  # CPU quota in whole CPUs (--cpus-per-task x tasks)
    pids_max: int | None = None
    io: IoLimit = IoLimit()
    io_devices: tuple[DevNum, ...] = ()  # the block devices the bps caps apply to
    deny_devices: tuple[DevNum, ...] = ()  # char devices the job may not open


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """One control file write: `value` into `file` of the job's `controller` cgroup
    (v2: the one cgroup; the controller names which must be enabled)."""

    controller: str
    file: str
    value: str
    optional: bool = False  # absent on some kernels/schedulers (io weight): skipped


def cgroup_name(job_id: int, attempt: int, generation: int, node: str) -> str:
    """The job cgroup's folder name under the muster root: one per worker."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node)
    return f"{job_id}_{attempt}_{generation}_{safe}"


def plan(limits: Limits, version: Version) -> tuple[Write, ...]:
    """Every control file write that sets `limits`, in the order they must happen."""
    if version is Version.V1:
        return (*_memory_v1(limits), *_cpu_v1(limits), *_pids(limits), *_devices_v1(limits),
                *_io_v1(limits))  # fmt: skip
    return (*_memory_v2(limits), *_cpu_v2(limits), *_pids(limits), *_io_v2(limits))


def _memory_v1(limits: Limits) -> tuple[Write, ...]:
    if limits.memory_bytes is None:
        return ()
    value = str(limits.memory_bytes)
    # memsw (memory + swap) must not be below the memory limit: set after it. Without
    # it a job could swap past its --mem, as Slurm's ConstrainSwapSpace prevents.
    return (
        Write(controller="memory", file="memory.limit_in_bytes", value=value),
        Write(controller="memory", file="memory.memsw.limit_in_bytes", value=value, optional=True),
    )


def _memory_v2(limits: Limits) -> tuple[Write, ...]:
    if limits.memory_bytes is None:
        return ()
    return (
        Write(controller="memory", file="memory.max", value=str(limits.memory_bytes)),
        Write(controller="memory", file="memory.swap.max", value="0", optional=True),
    )


def cpu_quota_us(cpus: float) -> int:
    """The CFS quota per `CPU_PERIOD_US` for `cpus` CPUs (at least 1 ms)."""
    return max(1000, round(cpus * CPU_PERIOD_US))


def _cpu_v1(limits: Limits) -> tuple[Write, ...]:
    if limits.cpus is None:
        return ()
    return (
        Write(controller="cpu", file="cpu.cfs_period_us", value=str(CPU_PERIOD_US)),
        Write(controller="cpu", file="cpu.cfs_quota_us", value=str(cpu_quota_us(limits.cpus))),
    )


def _cpu_v2(limits: Limits) -> tuple[Write, ...]:
    if limits.cpus is None:
        return ()
    value = f"{cpu_quota_us(limits.cpus)} {CPU_PERIOD_US}"
    return (Write(controller="cpu", file="cpu.max", value=value),)


def _pids(limits: Limits) -> tuple[Write, ...]:
    if limits.pids_max is None:
        return ()
    return (Write(controller="pids", file="pids.max", value=str(limits.pids_max)),)


def _devices_v1(limits: Limits) -> tuple[Write, ...]:
    # The child starts allowing what its parent allows; each denied device becomes an
    # exception. (v1 cannot re-allow one minor under a denied `195:*`: deny by minor.)
    return tuple(
        Write(controller="devices", file="devices.deny", value=f"c {dev} rwm")
        for dev in sorted(set(limits.deny_devices), key=lambda d: (d.major, d.minor))
    )


def _io_v1(limits: Limits) -> tuple[Write, ...]:
    writes: list[Write] = []
    if limits.io.weight is not None:
        weight = min(1000, max(10, limits.io.weight))  # v1 range; BFQ's own file
        writes.append(
            Write(controller="blkio", file="blkio.bfq.weight", value=str(weight), optional=True)
        )
    for dev in limits.io_devices:
        if limits.io.read_bps is not None:
            writes.append(
                Write(controller="blkio", file="blkio.throttle.read_bps_device",
                      value=f"{dev} {limits.io.read_bps}")
            )  # fmt: skip
        if limits.io.write_bps is not None:
            writes.append(
                Write(controller="blkio", file="blkio.throttle.write_bps_device",
                      value=f"{dev} {limits.io.write_bps}")
            )  # fmt: skip
    return tuple(writes)


def _io_v2(limits: Limits) -> tuple[Write, ...]:
    writes: list[Write] = []
    if limits.io.weight is not None:
        weight = min(10_000, max(1, limits.io.weight))
        writes.append(Write(controller="io", file="io.weight", value=f"default {weight}",
                            optional=True))  # fmt: skip
    caps = [
        f"{key}={value}"
        for key, value in (("rbps", limits.io.read_bps), ("wbps", limits.io.write_bps))
        if value is not None
    ]
    if caps:
        writes += [
            Write(controller="io", file="io.max", value=" ".join((str(dev), *caps)))
            for dev in limits.io_devices
        ]
    return tuple(writes)


def denied_gpus(gpus: Mapping[int, DevNum], own: Iterable[int]) -> tuple[DevNum, ...]:
    """The device numbers of this node's GPUs that are not the job's: the ones it may
    not open. Two indices naming the same device node deny nothing of the job's own."""
    mine = {gpus[i] for i in own if i in gpus}
    return tuple(dev for i, dev in sorted(gpus.items()) if dev not in mine)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/<pid>/cgroup` as {controller: path}; the v2 tree is under key ""; a named
    hierarchy (`name=systemd`) under its name."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1], parts[2]
        if controllers == "":
            out[""] = path
        for ctl in controllers.split(","):
            if ctl:
                out[ctl] = path
    return out


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A flat-keyed control file (`memory.events`, v1 `memory.oom_control`): {key: n}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value.strip())
    return out


class MemoryOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the job's cgroup says at its end: its memory, and the CPU time it used."""

    oom_kills: int | None = None  # None: the kernel does not count them here
    peak_bytes: int | None = None
    cpu_usec: int | None = None  # user + system CPU time of all its processes


def memory_outcome(version: Version, counters: str, peak: str) -> MemoryOutcome:
    """From `memory.oom_control` (v1) or `memory.events` (v2) and the peak file's text
    (`memory.max_usage_in_bytes` / `memory.peak`); empty text: not readable."""
    kills = parse_flat_keyed(counters).get("oom_kill")
    value = peak.strip()
    return MemoryOutcome(oom_kills=kills, peak_bytes=int(value) if value.isdigit() else None)


def cpu_usec(version: Version, text: str) -> int | None:
    """The CPU time a cgroup used, in microseconds: v2 `cpu.stat`'s `usage_usec`, v1
    `cpuacct.usage` (nanoseconds); None where the text is empty or not a count."""
    if version is Version.V2:
        return parse_flat_keyed(text).get("usage_usec")
    value = text.strip()
    return int(value) // 1000 if value.isdigit() else None


def parse_mounts(mountinfo: str) -> dict[str, str]:
    """From `/proc/self/mountinfo`: {controller: mount point} for v1 hierarchies and
    {"": mount point} for the cgroup2 tree (the first seen of each)."""
    out: dict[str, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point, fstype, options = fields[4], tail[0], tail[2]
        if fstype == "cgroup2":
            out.setdefault("", point)
        elif fstype == "cgroup":
            for opt in options.split(","):
                name = opt.removeprefix("name=")
                if opt in V1_CONTROLLERS or opt in ("freezer", "cpuacct", "cpuset") or name != opt:
                    out.setdefault(name, point)
    return out


def choose_version(mounts: Mapping[str, str], v2_controllers: Iterable[str]) -> Version | None:
    """v2 when the unified tree offers the memory controller, else v1 when the v1
    memory hierarchy is mounted, else None (no cgroups to use)."""
    if "" in mounts and "memory" in set(v2_controllers):
        return Version.V2
    if "memory" in mounts:
        return Version.V1
    return None
