"""Table tests of a container job's worker command (container_mode) and the podman
command line its shell builds (containerrun)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.launcher import containerrun
from services.launcher.container_mode import container_argv
from services.launcher.env import place_worker
from services.launcher.torchrun import worker_argv
from shared.jobspec import JobSpec

PY = "/opt/venv/bin/python"


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = {"user": "alice", "script": "{spool}/job.sh", "workdir": "/home/a"}
    return JobSpec(**(base | kw))  # type: ignore[arg-type]


def test_a_container_job_runs_its_script_through_containerrun() -> None:
    s = spec(container_image="img:1", container_mounts=("/data:/d:ro",), args=("x",))
    p = place_worker(s, job_id=4, attempt=0, generation=0, node="n1", nodelist=["n1"],
                     gpus=(0,), master_port=1)  # fmt: skip
    assert worker_argv(s, p, PY) == [
        PY, "-m", "services.launcher.containerrun", "--image=img:1", "--mount=/data:/d:ro",
        "--workdir=/home/a", "--mount={spool}:{spool}:ro", "--", "{spool}/job.sh", "x",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("given", "workdir"),
    [({}, "/home/a"), ({"container_workdir": "/w"}, "/w")],
)
def test_the_container_starts_in_the_given_folder_or_the_jobs(
    given: dict[str, object], workdir: str
) -> None:
    argv = container_argv(spec(container_image="i", **given), PY, ["s"], "{spool}")
    assert f"--workdir={workdir}" in argv


@pytest.mark.parametrize(
    ("mount", "volume"),
    [("/data", "/data:/data"), ("/data:/d", "/data:/d"), ("/data:/d:ro", "/data:/d:ro"),
     ("/data::ro", "/data:/data:ro")],
)  # fmt: skip
def test_pyxis_mounts_become_podman_volumes(mount: str, volume: str) -> None:
    assert containerrun.volume(mount) == volume


def test_only_the_allocated_gpus_device_nodes_are_passed(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    got = containerrun.gpu_devices("1,2", dev=str(tmp_path))
    assert got == [f"{tmp_path}/{n}" for n in ("nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm")]
    assert containerrun.gpu_devices("", dev=str(tmp_path)) == []  # no GPUs: none at all
    assert containerrun.gpu_devices("7", dev=str(tmp_path)) == [
        f"{tmp_path}/nvidiactl",
        f"{tmp_path}/nvidia-uvm",
    ]  # a simulated GPU has no node; the shared ones are still the driver's


@pytest.mark.parametrize(
    ("text", "parent"),
    [
        ("12:memory:/muster/job_4_0\n11:pids:/muster/job_4_0\n", "/muster/job_4_0"),
        (
            "0::/system.slice/muster-node.service/job_4_0\n",
            "/system.slice/muster-node.service/job_4_0",
        ),
        ("12:memory:/\n0::/\n", None),
    ],
)
def test_the_container_nests_in_the_workers_cgroup(
    text: str, parent: str | None, tmp_path: Path
) -> None:
    (tmp_path / "cgroup").write_text(text)
    assert containerrun.own_cgroup(str(tmp_path / "cgroup")) == parent


def test_the_podman_command_carries_environment_network_limits_and_mounts() -> None:
    args = containerrun.parse(["--image=img", "--mount=/a:/b", "--workdir=/b", "--", "s", "1"])
    argv = containerrun.podman_argv(args, "/usr/bin/podman", "muster-4-99")
    assert argv[-3:] == ["img", "s", "1"]
    for flag in ("--rm", "--env-host", "--network=host", "--name=muster-4-99"):
        assert flag in argv
    assert any(a.startswith("--ulimit=nproc=") for a in argv)
    assert argv[argv.index("-v") + 1] == "/a:/b" and argv[argv.index("-w") + 1] == "/b"
