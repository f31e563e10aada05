"""The cgroup shell on this machine's real cgroups (as root; skipped, naming what is
missing, elsewhere): a job cgroup is made with its limits, a child forked inside it is
confined, everything in it is killed, and nothing is left."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from services.launcher import cgroups
from services.launcher.cgroups_core import DevNum, IoLimit, Limits, Version
from services.launcher.worker_table import ProcessRef, kill_group, start_time

HIERARCHY = cgroups.detect()
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(HIERARCHY is None, reason="no usable memory cgroup controller here"),
]


@pytest.fixture
def root() -> Iterator[str]:
    """A muster root of this test's own, removed (with anything left in it) after."""
    name = f"muster-unit-{uuid.uuid4().hex[:8]}"
    yield name
    assert HIERARCHY is not None
    for ctl in ("memory", "cpu", "cpuacct", "pids", "devices", "blkio", ""):
        if ctl not in HIERARCHY.mounts:
            continue
        top = Path(HIERARCHY.mounts[ctl], HIERARCHY.own.get(ctl, "/").lstrip("/"), name)
        for child in top.glob("*/"):
            cgroups.remove(cgroups.CgroupRef(version=HIERARCHY.version, dirs={ctl: str(child)}))
        if top.exists():
            top.rmdir()


def _in_cgroup(ref: cgroups.CgroupRef, argv: list[str]) -> subprocess.Popen[bytes]:
    assert HIERARCHY is not None
    with cgroups.entered(ref, HIERARCHY):
        return subprocess.Popen(argv, stderr=subprocess.PIPE)


def test_limits_are_written_and_a_child_forked_inside_is_in_it_until_removed(root: str) -> None:
    assert HIERARCHY is not None
    limits = Limits(memory_bytes=64 << 20, cpus=0.5, pids_max=16)
    ref = cgroups.create(HIERARCHY, root, "job", limits)
    memory = ref.dir_of("memory")
    assert memory is not None
    if ref.version is Version.V1:
        assert Path(memory, "memory.limit_in_bytes").read_text().strip() == str(64 << 20)
    else:
        assert Path(memory, "memory.max").read_text().strip() == str(64 << 20)
    child = _in_cgroup(ref, ["sleep", "300"])
    assert child.pid in cgroups.procs(ref)
    assert os.getpid() not in cgroups.procs(ref)  # the parent went back where it was
    assert cgroups.remove(ref)
    assert child.wait(timeout=10) == -9
    assert all(not Path(d).exists() for d in ref.dirs.values())


def test_a_process_that_left_its_session_is_still_found_and_killed(root: str) -> None:
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits())
    with cgroups.entered(ref, HIERARCHY):
        leader = subprocess.Popen(
            ["sh", "-c", "setsid sleep 300 & echo $!; wait"], stdout=subprocess.PIPE
        )
    assert leader.stdout is not None
    escaped = int(leader.stdout.readline())  # forked by now: its pid is printed
    found = cgroups.procs(ref)
    assert escaped in found
    assert len(found) >= 2
    assert cgroups.kill(ref, 9) >= 2
    leader.wait(timeout=10)
    assert cgroups.remove(ref)


@pytest.mark.skipif(
    HIERARCHY is not None and "devices" not in HIERARCHY.mounts,
    reason="no v1 devices controller (v2 device confinement needs BPF)",
)
def test_a_denied_device_is_refused_and_an_allowed_one_gets_past_the_cgroup(
    root: str, tmp_path: Path
) -> None:
    assert HIERARCHY is not None
    for minor in (0, 1):
        os.mknod(tmp_path / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    assert cgroups.gpu_devices(str(tmp_path / "nvidia{index}")) == {
        0: DevNum(major=195, minor=0), 1: DevNum(major=195, minor=1),
    }  # fmt: skip
    ref = cgroups.create(HIERARCHY, root, "job", Limits(deny_devices=(DevNum(major=195, minor=0),)))
    probe = (
        "import os,sys\ntry: os.open(sys.argv[1], os.O_RDONLY)\nexcept OSError as e: print(e.errno)"
    )
    got = {}
    for minor in (0, 1):
        with cgroups.entered(ref, HIERARCHY):
            proc = subprocess.Popen(
                ["python3", "-c", probe, str(tmp_path / f"nvidia{minor}")], stdout=subprocess.PIPE
            )
        got[minor] = int(proc.communicate(timeout=30)[0] or 0)
    cgroups.remove(ref)
    # No driver stands behind the stand-ins: the allowed one fails later, with ENXIO.
    assert got == {0: errno.EPERM, 1: errno.ENXIO}


def test_a_limit_the_kernel_refuses_leaves_no_cgroup_behind(root: str) -> None:
    assert HIERARCHY is not None
    with pytest.raises(cgroups.CgroupError):
        cgroups.create(HIERARCHY, root, "job", Limits(pids_max=-5))
    assert HIERARCHY.version is Version.V2 or not any(
        Path(HIERARCHY.mounts[c], HIERARCHY.own.get(c, "/").lstrip("/"), root, "job").exists()
        for c in ("memory", "pids")
        if c in HIERARCHY.mounts
    )


def test_an_io_weight_the_kernel_has_no_file_for_is_skipped_and_one_it_has_is_written(
    root: str,
) -> None:
    """The weight's file (v1: blkio.bfq.weight) exists only with BFQ. Where it is absent
    the job still starts (cgroupfs answers a write that would create it with EACCES,
    which once failed every start on such a node) and no file is made."""
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits(io=IoLimit(weight=50)))
    if HIERARCHY.version is Version.V1:
        blkio = ref.dir_of("blkio")
        assert blkio is not None
        weight = Path(blkio, "blkio.bfq.weight")
    else:
        weight = Path(ref.dirs[""], "io.weight")
    if weight.exists():
        assert "50" in weight.read_text()
    assert cgroups.remove(ref)


def test_an_adopting_agent_kills_through_the_cgroup_even_after_the_leader_died(root: str) -> None:
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits())
    with cgroups.entered(ref, HIERARCHY):
        leader = subprocess.Popen(
            ["sh", "-c", "setsid sleep 300 & echo $!"], stdout=subprocess.PIPE
        )
    assert leader.stdout is not None
    escaped = int(leader.stdout.readline())
    leader.wait(timeout=10)
    dead_leader = ProcessRef(pid=leader.pid, start=0)  # gone: its group is never signalled
    assert kill_group(dead_leader, 9, ref)
    assert cgroups.remove(ref)
    assert not Path(f"/proc/{escaped}/cmdline").exists() or escaped not in cgroups.procs(ref)


def test_a_controller_the_node_lacks_fails_a_required_cgroup_and_is_skipped_otherwise(
    root: str,
) -> None:
    assert HIERARCHY is not None
    if HIERARCHY.version is Version.V2:
        pytest.skip("v1 only: v2 has one tree, no controller is mounted apart")
    without = msgspec.structs.replace(
        HIERARCHY, mounts={k: v for k, v in HIERARCHY.mounts.items() if k != "devices"}
    )
    deny = Limits(deny_devices=(DevNum(major=195, minor=0),))
    with pytest.raises(cgroups.CgroupError, match="devices"):
        cgroups.create(without, root, "strict", deny)
    ref = cgroups.create(without, root, "lenient", deny, strict=False)
    assert ref.missing == ("devices",) and "devices" not in ref.dirs
    assert cgroups.remove(ref)


def test_a_process_in_a_cgroup_below_the_jobs_is_found_killed_and_its_cgroup_removed(
    root: str,
) -> None:
    """A container's cgroup sits under the worker's (podman's --cgroup-parent): its
    processes are the job's too, and removal takes its folder first."""
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits())
    memory = ref.dir_of("memory")
    assert memory is not None
    below = Path(memory, "libpod-test")
    below.mkdir()
    nested = cgroups.CgroupRef(version=ref.version, dirs={"memory": str(below)})
    with cgroups.entered(nested, HIERARCHY):
        child = subprocess.Popen(["sleep", "300"])
    assert child.pid in cgroups.procs(ref)
    assert cgroups.remove(ref)
    assert child.wait(timeout=10) == -9
    assert not below.exists() and not Path(memory).exists()


def test_the_cgroup_pass_skips_the_group_that_killpg_reaches_so_each_gets_a_signal_once(
    root: str,
) -> None:
    """Signalled through its group and its cgroup both, a script got SIGTERM twice: its
    TERM trap ran twice and the second TERM killed what the first trap ran. The cgroup
    pass now reaches only what left the group."""
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits())
    with cgroups.entered(ref, HIERARCHY):
        leader = subprocess.Popen(
            ["sh", "-c", "sleep 300 & setsid sleep 300 & echo $!; wait"],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
    assert leader.stdout is not None
    escaped = int(leader.stdout.readline())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        len(cgroups.procs(ref)) < 3 or os.getpgid(escaped) == leader.pid  # not setsid yet
    ):
        time.sleep(0.05)
    assert len(cgroups.procs(ref)) == 3  # the script, its sleep, the escaped sleep
    assert cgroups.kill(ref, 0, but_group=leader.pid) == 1  # the escaped one alone
    assert cgroups.kill(ref, 0) == 3
    start = start_time(leader.pid)
    assert start is not None
    assert kill_group(ProcessRef(pid=leader.pid, start=start), 9, ref)
    assert leader.wait(timeout=10) == -9
    assert cgroups.remove(ref)
    assert escaped not in cgroups.procs(ref)


def test_only_the_forking_thread_enters_and_every_thread_comes_back(root: str) -> None:
    # v1 moves the calling thread alone (no RCU grace period on the start's path):
    # another thread of this process is never in the job's cgroup, before, during or
    # after, and the child is in it, forked from the thread that entered.
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits())
    memory = ref.dir_of("memory")
    assert memory is not None
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert other.native_id is not None
        with cgroups.entered(ref, HIERARCHY):
            inside = _members(memory)
            child = subprocess.Popen(["sleep", "300"])
        after = _members(memory)
    finally:
        release.set()
        other.join()
    assert child.pid in after
    assert other.native_id not in inside
    assert threading.get_native_id() not in after
    if ref.version is Version.V1:
        assert threading.get_native_id() in inside
    assert cgroups.remove(ref)
    assert child.wait(timeout=10) == -9


def _members(folder: str) -> set[int]:
    """The threads (v1 `tasks`) or processes (v2) in one cgroup folder."""
    name = "tasks" if Path(folder, "tasks").exists() else "cgroup.procs"
    return {int(t) for t in Path(folder, name).read_text().split()}


BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"


def test_the_cpu_time_and_memory_peak_a_job_used_are_read_at_its_end(root: str) -> None:
    """What sacct's TotalCPU and MaxRSS are made of: the cgroup's own counters, with
    cpuacct found whether it is mounted with cpu or on its own."""
    assert HIERARCHY is not None
    ref = cgroups.create(HIERARCHY, root, "job", Limits(memory_bytes=256 << 20))
    try:
        burner = _in_cgroup(ref, [sys.executable, "-c", BURN])
        assert burner.wait(timeout=60) == 0
        got = cgroups.outcome(ref)
    finally:
        cgroups.remove(ref)
    assert got.cpu_usec is not None and got.cpu_usec >= 300_000, got
    assert got.peak_bytes is not None and got.peak_bytes > 1 << 20, got
