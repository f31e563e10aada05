"""Table tests of the worker environment (services/launcher/env.py)."""

from __future__ import annotations

from typing import Any

import pytest

from services.launcher.env import (
    WorkerPlacement,
    build_env,
    compress_hostlist,
    exported_env,
    place_worker,
    tasks_per_node,
)
from shared.jobspec import JobSpec

NODES = ("node01", "node02", "node03")


def spec(**kw: Any) -> JobSpec:
    return JobSpec(**({"user": "alice", "script": "train.sh", "name": "llm"} | kw))


def placement(
    s: JobSpec, *, node: str = "node02", gpus: tuple[int, ...] = (3, 1)
) -> WorkerPlacement:
    return place_worker(
        s, job_id=42, attempt=3, generation=1, node=node, nodelist=NODES, gpus=gpus,
        master_port=29400,
    )  # fmt: skip


def pick(env: dict[str, str], keys: set[str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in keys}


RANK_KEYS = {
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "NODE_RANK", "GROUP_RANK", "RANK",
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
}  # fmt: skip

RANK_CASES = {
    "once per node, the node is the rank and GPUs come in PCI order": (
        spec(gpus_per_node=2),
        placement(spec(gpus_per_node=2)),
        {
            "MASTER_ADDR": "node01", "MASTER_PORT": "29400", "WORLD_SIZE": "3", "NNODES": "3",
            "NODE_RANK": "1", "GROUP_RANK": "1", "RANK": "1", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "CUDA_VISIBLE_DEVICES": "1,3",
        },
    ),
    "torchrun mode leaves per-process ranks to torchrun": (
        spec(gpus_per_node=2, torchrun=True),
        placement(spec(gpus_per_node=2, torchrun=True), node="node03"),
        {
            "MASTER_ADDR": "node01", "MASTER_PORT": "29400", "NNODES": "3", "NODE_RANK": "2",
            "CUDA_VISIBLE_DEVICES": "1,3",
        },
    ),
    "a CPU-only job sees no GPU at all (empty, not unset)": (
        spec(),
        placement(spec(), node="node01", gpus=()),
        {
            "MASTER_ADDR": "node01", "MASTER_PORT": "29400", "WORLD_SIZE": "3", "NNODES": "3",
            "NODE_RANK": "0", "GROUP_RANK": "0", "RANK": "0", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "CUDA_VISIBLE_DEVICES": "",
        },
    ),
}  # fmt: skip


@pytest.mark.parametrize(("s", "p", "want"), RANK_CASES.values(), ids=RANK_CASES.keys())
def test_rank_variables(s: JobSpec, p: WorkerPlacement, want: dict[str, str]) -> None:
    assert pick(build_env(s, p, {}), RANK_KEYS) == want


def slurm_of(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(("SLURM", "MUSTER_"))}


def test_a_script_on_the_first_node_only_is_told_the_jobs_tasks_as_sbatchs_is() -> None:
    first = spec(batch_first_node=True, ntasks_per_node=4)
    env = slurm_of(build_env(first, placement(first, node="node01"), {}))
    want = {
        "SLURM_NTASKS": "12",
        "SLURM_NPROCS": "12",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_TASKS_PER_NODE": "4(x3)",
    }
    assert {k: env[k] for k in want} == want
    every = spec(ntasks_per_node=4)  # a copy on every node: one task a node, its own
    env = slurm_of(build_env(every, placement(every, node="node01"), {}))
    got = (env["SLURM_NTASKS"], env["SLURM_NTASKS_PER_NODE"], env["SLURM_TASKS_PER_NODE"])
    assert got == ("3", "1", "1(x3)")


def test_a_job_that_asked_gpus_per_task_tells_its_script() -> None:
    asked = spec(gpus_per_node=4, ntasks_per_node=4, gpus_per_task=1, batch_first_node=True)
    assert slurm_of(build_env(asked, placement(asked), {}))["SLURM_GPUS_PER_TASK"] == "1"
    assert "SLURM_GPUS_PER_TASK" not in build_env(spec(), placement(spec()), {})


@pytest.mark.parametrize(
    ("counts", "text"),
    [((1,), "1"), ((8, 8), "8(x2)"), ((2, 2, 2, 1), "2(x3),1"), ((1, 2, 1), "1,2,1"), ((), "")],
)
def test_tasks_per_node_is_written_as_slurm_writes_it(counts: tuple[int, ...], text: str) -> None:
    assert tasks_per_node(counts) == text


def test_slurm_and_muster_set_of_an_array_task() -> None:
    s = spec(gpus_per_node=2, account="physics", partition="gpu", array_job_id=40,
             array_task_id=7, array_spec="1-9:2%2", workdir="/home/alice/run", mem_mib=4096,
             cpus_per_task=4)  # fmt: skip
    assert slurm_of(build_env(s, placement(s), {})) == {
        "MUSTER_JOB_ID": "42", "MUSTER_JOB_NAME": "llm", "MUSTER_ATTEMPT": "3",
        "MUSTER_GENERATION": "1", "MUSTER_RESTART_COUNT": "1", "MUSTER_NODE": "node02",
        "MUSTER_NODELIST": "node01,node02,node03", "MUSTER_NODES_MIN": "1",
        "MUSTER_NODES_MAX": "1",
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_NAME": "llm",
        "SLURM_JOB_USER": "alice", "SLURM_JOB_NODELIST": "node[01-03]",
        "SLURM_NODELIST": "node[01-03]", "SLURM_JOB_NUM_NODES": "3", "SLURM_NNODES": "3",
        "SLURM_NODEID": "1", "SLURMD_NODENAME": "node02", "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0", "SLURM_NTASKS": "3", "SLURM_NPROCS": "3",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x3)", "SLURM_CPUS_PER_TASK": "4",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_SUBMIT_DIR": "/home/alice/run", "SLURM_JOB_ACCOUNT": "physics",
        "SLURM_JOB_PARTITION": "gpu", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "1,3",
        "SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_JOB_ID": "40", "SLURM_MEM_PER_NODE": "4096",
        "SLURM_ARRAY_TASK_COUNT": "5", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "9",
        "SLURM_ARRAY_TASK_STEP": "2",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("array", "shape"),
    [
        ("0-5%2", {"COUNT": "6", "MIN": "0", "MAX": "5", "STEP": "1"}),
        ("7", {"COUNT": "1", "MIN": "7", "MAX": "7", "STEP": "1"}),
        ("1,2,5", {"COUNT": "3", "MIN": "1", "MAX": "5"}),  # no one step: none said
        ("0-12:4,16", {"COUNT": "5", "MIN": "0", "MAX": "16", "STEP": "4"}),
    ],
)
def test_an_array_task_is_told_its_arrays_shape(array: str, shape: dict[str, str]) -> None:
    """What a sweep shards its data by: SLURM_ARRAY_TASK_COUNT, _MIN, _MAX, _STEP."""
    s = spec(array_job_id=40, array_task_id=int(array.split("-")[0].split(",")[0]),
             array_spec=array)  # fmt: skip
    env = build_env(s, placement(s), {})
    got = {k.removeprefix("SLURM_ARRAY_TASK_"): v for k, v in env.items()
           if k.startswith("SLURM_ARRAY_TASK_") and k != "SLURM_ARRAY_TASK_ID"}  # fmt: skip
    assert got == shape


def test_a_job_that_is_not_an_array_task_gets_no_array_variables() -> None:
    env = build_env(spec(), placement(spec()), {})
    assert "SLURM_ARRAY_TASK_ID" not in env
    assert "SLURM_ARRAY_JOB_ID" not in env


BASE = {"PATH": "/usr/bin", "HOME": "/home/alice", "LANG": "C.UTF-8", "SECRET": "x"}

EXPORT_CASES = {
    "ALL passes the whole environment": ("ALL", BASE),
    "NONE passes nothing": ("NONE", {}),
    "a list passes only the named ones": ("PATH,LANG", {"PATH": "/usr/bin", "LANG": "C.UTF-8"}),
    "ALL in a list still passes everything": ("ALL,FOO=1", BASE),
    "assignments alone pass nothing from the base": ("FOO=1", {}),
    "an empty export is the default, ALL": ("", BASE),
}  # fmt: skip


@pytest.mark.parametrize(("export", "want"), EXPORT_CASES.values(), ids=EXPORT_CASES.keys())
def test_export_filters_the_base_environment(export: str, want: dict[str, str]) -> None:
    assert exported_env(export, BASE) == want


def user_vars(env: dict[str, str]) -> dict[str, str]:
    owned = RANK_KEYS | {"CUDA_DEVICE_ORDER"}
    return {
        k: v for k, v in env.items() if k not in owned and not k.startswith(("SLURM", "MUSTER_"))
    }


LAYER_CASES = {
    "spec.env overrides the base, export assignments override spec.env": (
        spec(export="PATH,FOO=from-export", env={"FOO": "from-spec", "BAR": "b"}),
        {"PATH": "/usr/bin", "FOO": "from-base"},
        {"PATH": "/usr/bin", "FOO": "from-export", "BAR": "b"},
    ),
    "inherited launcher variables never leak into a worker": (
        spec(),
        {"PATH": "/usr/bin", "SLURM_JOB_ID": "9", "RANK": "5", "TORCHELASTIC_RUN_ID": "x",
         "PET_NNODES": "4", "LOCAL_RANK": "3"},
        {"PATH": "/usr/bin"},
    ),
    "a user cannot override the launcher's own variables": (
        spec(torchrun=True, env={"RANK": "7", "MUSTER_JOB_ID": "1"}),
        {},
        {},
    ),
}  # fmt: skip


@pytest.mark.parametrize(("s", "base", "want"), LAYER_CASES.values(), ids=LAYER_CASES.keys())
def test_environment_layers(s: JobSpec, base: dict[str, str], want: dict[str, str]) -> None:
    env = build_env(s, placement(s), base)
    assert user_vars(env) == want
    assert env["MUSTER_JOB_ID"] == "42"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_placement_derives_master_and_a_new_rendezvous_id_per_generation() -> None:
    p = placement(spec(nodes_min=2, nodes_max=4))
    assert (p.master_addr, p.rdzv_endpoint, p.rdzv_id, p.node_rank, p.gpus) == (
        "node01",
        "node01:29400",
        "42-3-1",
        1,
        (1, 3),
    )
    assert (p.elastic_min, p.elastic_max) == (2, 4)


HOSTLIST_CASES = {
    "zero-padded runs become one range": (["node01", "node02", "node03"], "node[01-03]"),
    "gaps split the range": (["n1", "n2", "n4", "n5", "n9"], "n[1-2,4-5,9]"),
    "one name stays as it is": (["gpu07"], "gpu07"),
    "prefixes group separately and sort": (["b1", "a2", "a1", "login"], "a[1-2],b1,login"),
    "order and duplicates do not matter": (["node03", "node01", "node03", "node02"], "node[01-03]"),
    "nothing is nothing": ([], ""),
}  # fmt: skip


@pytest.mark.parametrize(("hosts", "want"), HOSTLIST_CASES.values(), ids=HOSTLIST_CASES.keys())
def test_compress_hostlist(hosts: list[str], want: str) -> None:
    assert compress_hostlist(hosts) == want
