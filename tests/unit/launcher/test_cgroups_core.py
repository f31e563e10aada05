"""Table tests of the pure cgroup core: limits -> control file writes, and the parsers
of what the kernel reports."""

from __future__ import annotations

import pytest

from services.launcher.cgroups_core import (
    DevNum,
    IoLimit,
    Limits,
    MemoryOutcome,
    Version,
    Write,
    cgroup_name,
    choose_version,
    cpu_usec,
    denied_gpus,
    memory_outcome,
    parse_flat_keyed,
    parse_mounts,
    parse_proc_cgroup,
    plan,
)

SDA = DevNum(major=8, minor=0)
GPU = {i: DevNum(major=195, minor=i) for i in range(4)}

PLANS = {
    "no limits write nothing": (Limits(), Version.V1, ()),
    "--mem on v1 sets the limit, then memory+swap to the same": (
        Limits(memory_bytes=100 << 20),
        Version.V1,
        (
            Write(controller="memory", file="memory.limit_in_bytes", value="104857600"),
            Write(
                controller="memory",
                file="memory.memsw.limit_in_bytes",
                value="104857600",
                optional=True,
            ),
        ),
    ),
    "--mem on v2 sets memory.max and no swap": (
        Limits(memory_bytes=1 << 30),
        Version.V2,
        (
            Write(controller="memory", file="memory.max", value="1073741824"),
            Write(controller="memory", file="memory.swap.max", value="0", optional=True),
        ),
    ),
    "two CPUs on v1 are a 200 ms quota per 100 ms": (
        Limits(cpus=2.0),
        Version.V1,
        (
            Write(controller="cpu", file="cpu.cfs_period_us", value="100000"),
            Write(controller="cpu", file="cpu.cfs_quota_us", value="200000"),
        ),
    ),
    "half a CPU on v2 is one cpu.max line": (
        Limits(cpus=0.5),
        Version.V2,
        (Write(controller="cpu", file="cpu.max", value="50000 100000"),),
    ),
    "a pids limit is the same file on both": (
        Limits(pids_max=64),
        Version.V2,
        (Write(controller="pids", file="pids.max", value="64"),),
    ),
    "other GPUs are denied by their minor, in order, once each": (
        Limits(deny_devices=(GPU[3], GPU[0], GPU[3])),
        Version.V1,
        (
            Write(controller="devices", file="devices.deny", value="c 195:0 rwm"),
            Write(controller="devices", file="devices.deny", value="c 195:3 rwm"),
        ),
    ),
    "v2 has no devices file: confinement there needs BPF, nothing is written": (
        Limits(deny_devices=(GPU[0],)),
        Version.V2,
        (),
    ),
    "v1 I/O: a bfq weight clamped to its range and bps caps per device": (
        Limits(io=IoLimit(weight=5000, read_bps=1000, write_bps=2000), io_devices=(SDA,)),
        Version.V1,
        (
            Write(controller="blkio", file="blkio.bfq.weight", value="1000", optional=True),
            Write(controller="blkio", file="blkio.throttle.read_bps_device", value="8:0 1000"),
            Write(controller="blkio", file="blkio.throttle.write_bps_device", value="8:0 2000"),
        ),
    ),
    "v2 I/O: io.weight and one io.max line per device": (
        Limits(io=IoLimit(weight=50, write_bps=2000), io_devices=(SDA,)),
        Version.V2,
        (
            Write(controller="io", file="io.weight", value="default 50", optional=True),
            Write(controller="io", file="io.max", value="8:0 wbps=2000"),
        ),
    ),
    "bps caps without a device to apply to write nothing": (
        Limits(io=IoLimit(read_bps=1000)),
        Version.V2,
        (),
    ),
}


@pytest.mark.parametrize(("limits", "version", "want"), PLANS.values(), ids=PLANS.keys())
def test_plan(limits: Limits, version: Version, want: tuple[Write, ...]) -> None:
    assert plan(limits, version) == want


DENIED = {
    "a job on GPU 1 is denied 0, 2 and 3": ({1}, (GPU[0], GPU[2], GPU[3])),
    "a job on every GPU is denied none": ({0, 1, 2, 3}, ()),
    "a job without GPUs is denied all": (set(), tuple(GPU.values())),
    "an index the node lacks changes nothing": ({1, 9}, (GPU[0], GPU[2], GPU[3])),
}


@pytest.mark.parametrize(("own", "want"), DENIED.values(), ids=DENIED.keys())
def test_denied_gpus(own: set[int], want: tuple[DevNum, ...]) -> None:
    assert denied_gpus(GPU, own) == want


def test_two_indices_naming_one_device_never_deny_the_jobs_own() -> None:
    same = {0: GPU[0], 1: GPU[0], 2: GPU[2]}
    assert denied_gpus(same, {1}) == (GPU[2],)


def test_proc_cgroup_of_a_hybrid_machine_names_each_controller_and_the_unified_tree() -> None:
    text = "9:name=systemd:/\n8:pids:/a\n2:cpu,cpuacct:/b\n4:memory:/m/x\n0::/u\n"
    assert parse_proc_cgroup(text) == {
        "name=systemd": "/", "pids": "/a", "cpu": "/b", "cpuacct": "/b", "memory": "/m/x", "": "/u",
    }  # fmt: skip


MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 30 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
"""


def test_mounts_name_every_v1_controller_and_the_cgroup2_tree() -> None:
    assert parse_mounts(MOUNTINFO) == {
        "": "/sys/fs/cgroup/unified",
        "memory": "/sys/fs/cgroup/memory",
        "cpu": "/sys/fs/cgroup/cpu,cpuacct",
        "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
        "systemd": "/sys/fs/cgroup/systemd",
    }


HYBRID = {"": "/u", "memory": "/m"}
VERSIONS = {
    "a unified tree offering memory is v2": (HYBRID, ["memory", "pids"], Version.V2),
    "a hybrid machine whose unified tree is empty is v1": (HYBRID, ["hugetlb"], Version.V1),
    "no memory controller anywhere is none": ({"": "/u"}, [], None),
}


@pytest.mark.parametrize(("mounts", "offered", "want"), VERSIONS.values(), ids=VERSIONS.keys())
def test_choose_version(mounts: dict[str, str], offered: list[str], want: Version | None) -> None:
    assert choose_version(mounts, offered) == want


OUTCOMES = {
    "v1 oom_control with a kill and the peak": (
        Version.V1, "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "104857600\n",
        MemoryOutcome(oom_kills=1, peak_bytes=104857600),
    ),
    "v2 memory.events without kills": (
        Version.V2, "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n", "4096",
        MemoryOutcome(oom_kills=0, peak_bytes=4096),
    ),
    "an old kernel without the counter or the peak": (
        Version.V1, "oom_kill_disable 0\nunder_oom 0\n", "", MemoryOutcome(),
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("version", "counters", "peak", "want"), OUTCOMES.values(), ids=OUTCOMES.keys()
)
def test_memory_outcome(version: Version, counters: str, peak: str, want: MemoryOutcome) -> None:
    assert memory_outcome(version, counters, peak) == want


def test_flat_keyed_files_skip_lines_that_are_not_counts() -> None:
    assert parse_flat_keyed("a 1\nb x\nc -2\n\n") == {"a": 1, "c": -2}


def test_a_cgroup_name_is_one_path_component_whatever_the_node_is_called() -> None:
    assert cgroup_name(12, 3, 1, "rack1/node 07") == "12_3_1_rack1_node_07"


CPU = {
    "v2 cpu.stat: usage_usec": (
        Version.V2, "usage_usec 2750000\nuser_usec 2000000\nsystem_usec 750000\n", 2_750_000,
    ),
    "v1 cpuacct.usage: nanoseconds": (Version.V1, "2750000123\n", 2_750_000),
    "not readable: not known": (Version.V1, "", None),
    "v2 without the key: not known": (Version.V2, "nr_periods 0\n", None),
}  # fmt: skip


@pytest.mark.parametrize(("version", "text", "want"), CPU.values(), ids=CPU.keys())
def test_cpu_usec(version: Version, text: str, want: int | None) -> None:
    assert cpu_usec(version, text) == want
