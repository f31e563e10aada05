"""Table tests of what a worker gets: the node's isolation settings and the worker's
limits -> the `Isolation` stepd applies; the configuration's I/O policy of a job."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission.config import load_config
from services.admission.config_io import job_io
from services.admission.config_model import IoPolicy
from services.launcher.cgroups import Hierarchy, detect
from services.launcher.cgroups_core import DevNum, IoLimit, Limits, Version
from services.launcher.isolation import CgroupMode, NodeIsolation, cgroup_mode, for_worker
from shared.api import WorkerLimits

GPU = {i: DevNum(major=195, minor=i) for i in range(4)}
SDA = DevNum(major=8, minor=0)
NODE = NodeIsolation(pids_max=512, gpus=GPU, io_devices=(SDA,), scope="ab12")

LIMITS = {
    "an older launcher's spec confines no device and sets only the node's pids limit": (
        None,
        Limits(pids_max=512),
    ),
    "--mem, CPUs, GPU 1 and an account's I/O": (
        WorkerLimits(memory_mib=100, cpus=2.0, gpus=(1,), io_weight=50, io_write_bps=10),
        Limits(
            memory_bytes=100 << 20, cpus=2.0, pids_max=512,
            io=IoLimit(weight=50, write_bps=10), io_devices=(SDA,),
            deny_devices=(GPU[0], GPU[2], GPU[3]),
        ),
    ),
    "a job without GPUs may open none": (
        WorkerLimits(gpus=()),
        Limits(pids_max=512, io_devices=(SDA,), deny_devices=tuple(GPU.values())),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("limits", "want"), LIMITS.values(), ids=LIMITS.keys())
def test_for_worker_limits(limits: WorkerLimits | None, want: Limits) -> None:
    got = for_worker(NODE, job_id=7, attempt=1, generation=0, node_name="n1", env={}, limits=limits)
    assert got.limits == want


def test_the_cgroup_is_named_for_the_worker_and_the_agent_and_hooks_see_only_slurm_variables() -> (
    None
):
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "1", "SECRET": "x", "PATH": "/evil"}
    got = for_worker(NODE, job_id=7, attempt=1, generation=2, node_name="n1", env=env, limits=None)
    assert got.cgroup_name == "7_1_2_n1_ab12"
    assert got.hook_env == {
        "SLURM_JOB_ID": "7",
        "CUDA_VISIBLE_DEVICES": "1",
        "SLURMD_NODENAME": "n1",
    }


def test_without_a_cpu_quota_setting_cpus_are_not_limited() -> None:
    node = NodeIsolation(cpu_quota=False)
    got = for_worker(
        node, job_id=1, attempt=1, generation=0, node_name="n", env={},
        limits=WorkerLimits(cpus=4.0),
    )  # fmt: skip
    assert got.limits.cpus is None


MODES = {
    "auto": CgroupMode(enabled=True, required=False),
    "required": CgroupMode(enabled=True, required=True),
    "off": CgroupMode(enabled=False, required=False),
}


@pytest.mark.parametrize(("setting", "want"), MODES.items(), ids=MODES.keys())
def test_cgroup_mode(setting: str, want: CgroupMode) -> None:
    assert cgroup_mode(setting) == want


CONFIG = """
[cluster]
default_partition = "batch"
[partitions.batch]
io_weight = 100
io_read_bps = 500000000
[partitions.infer]
io_weight = 800
[accounts.root]
shares = 1
[accounts.ckpt]
parent = "root"
shares = 1
io_weight = 10
io_write_bps = 200000000
[accounts.team]
parent = "ckpt"
shares = 1
[accounts.other]
parent = "root"
shares = 1
"""

POLICIES = {
    "the account's own settings win field by field over the partition's": (
        "ckpt", "batch", IoPolicy(weight=10, read_bps=500000000, write_bps=200000000),
    ),
    "a child account inherits its parent's": (
        "team", "infer", IoPolicy(weight=10, write_bps=200000000),
    ),
    "an account without settings gets the partition's": (
        "other", "infer", IoPolicy(weight=800),
    ),
    "an unknown partition and account: nothing": ("nobody", "gone", IoPolicy()),
}  # fmt: skip


@pytest.mark.parametrize(("account", "partition", "want"), POLICIES.values(), ids=POLICIES.keys())
def test_job_io(account: str, partition: str, want: IoPolicy) -> None:
    assert job_io(load_config(CONFIG), account, partition) == want


def test_an_agent_in_its_v2_leaf_makes_job_cgroups_beside_it_and_returns_to_the_leaf(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "cg"
    (tree / "svc" / "muster-agent").mkdir(parents=True)
    (tree / "svc" / "cgroup.controllers").write_text("cpu io memory pids\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(f"31 30 0:27 / {tree} rw,relatime - cgroup2 cgroup2 rw\n")
    (proc / "cgroup").write_text("0::/svc/muster-agent\n")
    got = detect(str(proc))
    assert got == Hierarchy(
        version=Version.V2, mounts={"": str(tree)}, own={"": "/svc/muster-agent"},
        base={"": "/svc"},
    )  # fmt: skip
    assert got.base_of("") == "/svc"


def test_a_machine_without_a_memory_controller_has_no_hierarchy_to_use(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text("30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    assert detect(str(tmp_path)) is None
