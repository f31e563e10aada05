"""Validation against the local cluster: defaults filled, refusals that say what exists."""

from __future__ import annotations

import msgspec
import pytest

from services.admission.cluster_shape import NodeShape, shape
from services.admission.config import load_config
from services.admission.errors import ErrorCode, SubmitError
from services.admission.sbatch import parse_submission
from services.admission.validate import Admission, SubmitCounts, admit, validate
from shared.jobspec import JobSpec

from .builders import REPO, local_cluster, local_config, node

SCRIPT = "#!/bin/bash\nsrun python train.py\n"
CONFIG = local_config()
CLUSTER = local_cluster(CONFIG)


def admitted(*argv: str, user: str = "alice", counts: SubmitCounts | None = None) -> Admission:
    parsed = parse_submission(argv, SCRIPT, user=user, workdir="/w", script_path="train.sh")
    assert parsed.spec is not None, parsed.errors
    return admit(parsed.spec, parsed.explicit, CONFIG, CLUSTER, counts or SubmitCounts())


def accepted(*argv: str, user: str = "alice") -> JobSpec:
    got = admitted(*argv, user=user)
    assert got.errors == ()
    assert got.spec is not None
    return got.spec


BASE = JobSpec(
    name="train.sh",
    user="alice",
    account="research",
    partition="normal",
    qos="normal",
    script=SCRIPT,
    script_name="train.sh",
    workdir="/w",
    time_limit_s=3600,
)

DEFAULTS = {
    "nothing asked: default partition, the user's default account, its default time": (
        (),
        "alice",
        {},
    ),
    "a partition's own default time and default QOS": (
        ("-p", "inference"),
        "dave",
        {
            "user": "dave",
            "account": "prod",
            "partition": "inference",
            "partitions": ("inference",),
            "qos": "high",
            "time_limit_s": 86400,
        },
    ),
    "UNLIMITED becomes the partition's maximum": (
        ("-p", "large", "-t", "UNLIMITED"),
        "alice",
        {"partition": "large", "partitions": ("large",), "time_limit_s": 14 * 86400},
    ),
    "UNLIMITED stays unlimited on an unlimited partition": (
        ("-p", "inference", "-t", "INFINITE", "-A", "prod"),
        "bob",
        {
            "user": "bob",
            "account": "prod",
            "partition": "inference",
            "partitions": ("inference",),
            "qos": "high",
            "time_limit_s": 2**31 - 1,
        },
    ),
    "the first partition of a list that fits is chosen": (
        ("-p", "debug,normal", "-N", "2"),
        "alice",
        {"partitions": ("debug", "normal"), "nodes_min": 2, "nodes_max": 2},
    ),
    "total GPUs with no node count take the fewest nodes": (
        ("-G", "12"),
        "alice",
        {"gpus_total": 12, "gpus_per_node": 4, "nodes_min": 3, "nodes_max": 3},
    ),
}


@pytest.mark.parametrize(("argv", "user", "changes"), DEFAULTS.values(), ids=DEFAULTS.keys())
def test_defaults_are_filled(argv: tuple[str, ...], user: str, changes: dict[str, object]) -> None:
    assert accepted(*argv, user=user) == msgspec.structs.replace(BASE, **changes)


def err(code: ErrorCode, message: str, field: str) -> SubmitError:
    return SubmitError(code=code, message=message, field=field)


REFUSALS = {
    "an unknown partition lists the partitions": (
        ("-p", "gpu"),
        "alice",
        err(
            ErrorCode.UNKNOWN_PARTITION,
            "no partition 'gpu'; partitions: debug, normal, large, inference",
            "partition",
        ),
    ),
    "time over the maximum says the maximum": (
        ("-p", "debug", "-t", "45"),
        "alice",
        err(
            ErrorCode.TIME_OVER_MAX,
            "time limit 00:45:00 is over the maximum of partition 'debug': 00:30:00; "
            "ask for --time=00:30:00 or less",
            "time",
        ),
    ),
    "more GPUs per node than any node has names the largest node": (
        ("--gpus-per-node=9",),
        "alice",
        err(
            ErrorCode.TOO_MANY_GPUS_PER_NODE,
            "9 GPUs per node asked; the largest node in partition 'normal' has 4 GPU(s)",
            "gpus-per-node",
        ),
    ),
    "more nodes than the partition has": (
        ("-N", "5"),
        "alice",
        err(
            ErrorCode.TOO_MANY_NODES,
            "5 nodes asked; partition 'normal' has 4 node(s)",
            "nodes",
        ),
    ),
    "an elastic maximum beyond the partition is refused too": (
        ("-N", "2:8"),
        "alice",
        err(ErrorCode.TOO_MANY_NODES, "8 nodes asked; partition 'normal' has 4 node(s)", "nodes"),
    ),
    "more nodes than the partition allows per job": (
        ("-p", "debug", "-N", "2"),
        "alice",
        err(
            ErrorCode.TOO_MANY_NODES,
            "2 nodes asked; partition 'debug' allows at most 1 node(s) per job",
            "nodes",
        ),
    ),
    "an account the partition does not allow": (
        ("-p", "inference"),
        "alice",
        err(
            ErrorCode.ACCOUNT_NOT_ALLOWED,
            "account 'research' may not use partition 'inference'; allowed accounts: prod",
            "account",
        ),
    ),
    "an unknown QOS lists the QOS": (
        ("-q", "urgent"),
        "alice",
        err(ErrorCode.UNKNOWN_QOS, "no QOS 'urgent'; QOS defined: high, normal, low", "qos"),
    ),
    "a user outside the account": (
        ("-A", "prod"),
        "alice",
        err(
            ErrorCode.USER_NOT_IN_ACCOUNT,
            "user 'alice' is not in account 'prod'; your accounts: research",
            "account",
        ),
    ),
    "an unknown user": (
        (),
        "mallory",
        err(
            ErrorCode.UNKNOWN_USER,
            "user 'mallory' has no account on this cluster; ask an operator or an account "
            "coordinator to add you",
            "account",
        ),
    ),
    "an unknown account": (
        ("-A", "physics"),
        "alice",
        err(ErrorCode.UNKNOWN_ACCOUNT, "no account 'physics'; your accounts: research", "account"),
    ),
    "a GPU model the partition lacks lists the models": (
        ("--gres=gpu:h100:1",),
        "alice",
        err(
            ErrorCode.NO_MATCHING_NODES,
            "no node in partition 'normal' has GPU type 'h100'; GPU types there: sim",
            "gres",
        ),
    ),
    "a node that does not exist": (
        ("-w", "node09"),
        "alice",
        err(ErrorCode.UNKNOWN_NODE, "no node(s) node09; the cluster has node[01-04]", "nodelist"),
    ),
    "a node outside the partition": (
        ("-p", "debug", "-w", "node01"),
        "alice",
        err(
            ErrorCode.UNKNOWN_NODE,
            "node(s) node01 are not in partition 'debug', whose nodes are node04",
            "nodelist",
        ),
    ),
}


@pytest.mark.parametrize(("argv", "user", "want"), REFUSALS.values(), ids=REFUSALS.keys())
def test_refusals(argv: tuple[str, ...], user: str, want: SubmitError) -> None:
    got = admitted(*argv, user=user)
    assert got == Admission(spec=None, errors=(want,))


def test_only_operators_raise_priority_with_a_negative_nice() -> None:
    assert admitted("--nice=-10", user="root").errors == ()
    assert admitted("--nice=-10").errors == (
        err(
            ErrorCode.NOT_PERMITTED,
            "--nice=-10: only an operator may raise a job's priority; use 0 or more",
            "nice",
        ),
    )


def test_submit_limits_count_array_tasks() -> None:
    got = admitted("-a", "0-9", counts=SubmitCounts(user_jobs=495))
    assert got.errors == (
        err(
            ErrorCode.SUBMIT_LIMIT,
            "user 'alice' already has 495 job(s) queued or running under QOS 'normal'; "
            "adding 10 would pass its limit of 500 submitted jobs. Wait for some to finish",
            "qos",
        ),
    )


def test_account_submit_limit() -> None:
    got = admitted(counts=SubmitCounts(account_jobs=2000))
    assert [e.code for e in got.errors] == [ErrorCode.SUBMIT_LIMIT]
    assert "account 'research' already has 2000 job(s)" in got.errors[0].message


def test_a_partition_needing_approval_is_flagged_not_refused() -> None:
    got = admitted("-p", "large")
    assert (got.errors, got.needs_approval) == ((), True)


def test_every_candidate_partition_says_why_it_refused() -> None:
    got = admitted("-p", "debug,normal", "-N", "5")
    assert [e.message for e in got.errors] == [
        "partition 'debug': 5 nodes asked; partition 'debug' allows at most 1 node(s) per job",
        "partition 'normal': 5 nodes asked; partition 'normal' has 4 node(s)",
    ]


def test_a_partition_list_with_an_unusable_name_is_refused_whole() -> None:
    got = admitted("-p", "debug,inference")
    assert [e.message for e in got.errors] == [
        "partition list 'debug,inference': 'inference' is not usable: account 'research' "
        "may not use partition 'inference'; allowed accounts: prod",
    ]


def test_constraints_and_models_filter_nodes() -> None:
    cluster = shape(
        CONFIG,
        [
            node("node01", 4, "A100", "ib"),
            node("node02", 4, "A100", "ib"),
            node("node03", 4, "H100"),
            node("node04", 4, "H100", "ib"),
        ],
    )
    spec = msgspec.structs.replace(
        BASE, nodes_min=2, nodes_max=2, gpus_per_node=4, gpu_model="a100"
    )
    assert validate(spec, CONFIG, cluster) == ()
    ib_h100 = msgspec.structs.replace(spec, gpu_model="H100", constraint="ib")
    assert [e.message for e in validate(ib_h100, CONFIG, cluster)] == [
        "2 nodes asked; partition 'normal' has 1 node(s) that match the request"
    ]
    nvlink = msgspec.structs.replace(spec, gpu_model=None, constraint="nvlink|ib&fast")
    assert [e.message for e in validate(nvlink, CONFIG, cluster)] == [
        "no node in partition 'normal' matches --constraint 'nvlink|ib&fast'; features: ib"
    ]
    brackets = msgspec.structs.replace(spec, gpu_model=None, constraint="[a*2]")
    assert [e.code for e in validate(brackets, CONFIG, cluster)] == [ErrorCode.NO_MATCHING_NODES]
    nested = msgspec.structs.replace(spec, gpu_model=None, constraint="(a|b)&c")
    assert [e.code for e in validate(nested, CONFIG, cluster)] == [ErrorCode.BAD_VALUE]


def sized(name: str, cpus: int, mib: int) -> NodeShape:
    return msgspec.structs.replace(node(name), cpus=cpus, memory_mib=mib)


SIZES = {
    "memory no node has": (
        ("--mem=200G",), "--mem of 204800 MiB per node: no node in partition 'normal' has that"
        " much memory; its largest has 131072 MiB",
    ),
    "CPUs no node has": (
        ("--cpus-per-task=16", "--ntasks-per-node=4"), "64 CPUs per node (--cpus-per-task x"
        " --ntasks-per-node): no node in partition 'normal' has that many; its largest has 48",
    ),
    "each alone fits, not both together": (
        ("--mem=100G", "-c", "48"), "48 CPUs per node (--cpus-per-task x --ntasks-per-node) and"
        " 102400 MiB of --mem: no node in partition 'normal' has both",
    ),
    "fewer big nodes than the job's": (
        ("-N", "2", "--mem=100G"), "2 nodes asked; partition 'normal' has 1 node(s) that match"
        " the request",
    ),
}  # fmt: skip


@pytest.mark.parametrize(("argv", "said"), SIZES.values(), ids=SIZES.keys())
def test_a_job_bigger_than_every_node_is_refused_naming_the_largest(
    argv: tuple[str, ...], said: str
) -> None:
    cluster = shape(
        CONFIG,
        [sized("node01", 48, 65536), sized("node02", 32, 131072), sized("node03", 16, 32768)],
    )
    assert [e.message for e in validate(accepted(*argv), CONFIG, cluster)] == [said]


def test_a_node_whose_size_is_not_known_fits_any_job() -> None:
    cluster = shape(CONFIG, [sized("node01", 8, 1024), node("node02")])  # an older agent
    assert validate(accepted("--mem=200G", "-c", "64"), CONFIG, cluster) == ()


def test_a_job_needing_the_gpus_another_partition_keeps_is_refused() -> None:
    """debug keeps 2 of node04's GPUs (reserved_gpus): a 16-GPU job in normal, whose nodes
    hold them, could never start; the placer would only say so once queued."""
    wide = msgspec.structs.replace(BASE, nodes_min=4, nodes_max=4, gpus_per_node=4)
    [error] = validate(wide, CONFIG, CLUSTER)
    assert error.message == (
        "16 GPUs asked; partition 'normal' has 16, of which debug keeps 2 for its own jobs"
        " (reserved_gpus): ask for at most 14"
    )
    assert validate(accepted("-N", "4", "--gpus-per-node=3"), CONFIG, CLUSTER) == ()
    assert validate(accepted("-p", "debug", "--gpus-per-node=4"), CONFIG, CLUSTER) == ()


def test_a_gpu_cap_counts_every_node() -> None:
    config = msgspec.structs.replace(
        CONFIG,
        partitions={
            **CONFIG.partitions,
            "normal": msgspec.structs.replace(CONFIG.partitions["normal"], max_gpus_per_job=8),
        },
    )
    spec = accepted("-N", "3", "--gpus-per-node=4")
    assert [e.message for e in validate(spec, config, CLUSTER)] == [
        "12 GPUs asked; partition 'normal' allows at most 8 GPUs per job"
    ]


def test_a_container_job_needs_nodes_whose_agent_found_a_runtime() -> None:
    spec = msgspec.structs.replace(BASE, container_image="localhost/base:1", constraint="container")
    without = shape(CONFIG, [node(f"node0{i}") for i in range(1, 5)])
    [error] = validate(spec, CONFIG, without)
    assert error.code is ErrorCode.NO_MATCHING_NODES and error.field == "container-image"
    assert "no node of partition 'normal' has a container runtime" in error.message
    assert "install podman" in error.message
    some = shape(CONFIG, [node("node01", 4, "SIM", "container"), node("node02")])
    assert validate(spec, CONFIG, some) == ()


DEFAULT_MEMORY = {
    "per GPU: times the GPUs asked of each node": (
        {"def_mem_per_gpu": '"16G"'}, ("--gpus-per-node=2",), 32768,
    ),
    "per GPU, a job without GPUs: none": ({"def_mem_per_gpu": '"16G"'}, (), None),
    "per GPU, --gpus=N split over nodes: per node's share": (
        {"def_mem_per_gpu": '"16G"'}, ("--gpus=8",), 65536,
    ),
    "per CPU: times the CPUs of each node": (
        {"def_mem_per_cpu": "1024"}, ("-c", "4", "--ntasks-per-node=2"), 8192,
    ),
    "the job's own --mem wins": (
        {"def_mem_per_gpu": '"16G"'}, ("--gpus-per-node=2", "--mem=1G"), 1024,
    ),
    "--mem=0 (all of the node's) stays": (
        {"def_mem_per_gpu": '"16G"'}, ("--gpus-per-node=2", "--mem=0"), 0,
    ),
    "--mem-per-cpu wins": (
        {"def_mem_per_gpu": '"16G"'}, ("--gpus-per-node=2", "--mem-per-cpu=100"), 100,
    ),
    "no default: none": ({}, ("--gpus-per-node=2",), None),
}  # fmt: skip


@pytest.mark.parametrize(
    ("sizes", "argv", "want"), DEFAULT_MEMORY.values(), ids=DEFAULT_MEMORY.keys()
)
def test_a_job_giving_no_memory_gets_its_partitions_default(
    sizes: dict[str, str], argv: tuple[str, ...], want: int | None
) -> None:
    text = (REPO / "deploy" / "local" / "cluster.toml").read_text()
    lines = "".join(f"{key} = {value}\n" for key, value in sizes.items())
    text = text.replace("[partitions.normal]\n", f"[partitions.normal]\n{lines}", 1)
    config = load_config(text)
    parsed = parse_submission(argv, SCRIPT, user="alice", workdir="/w", script_path="t.sh")
    assert parsed.spec is not None, parsed.errors
    got = admit(parsed.spec, parsed.explicit, config, local_cluster(config), SubmitCounts())
    assert got.errors == () and got.spec is not None, got.errors
    assert got.spec.mem_mib == want
