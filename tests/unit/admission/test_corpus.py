"""The Slurm-habits corpus: realistic `#SBATCH` scripts and command lines (typed GPUs,
features, partition lists, spacing and comments) against a cluster of H100, A100 and
V100 nodes with features, each with the admitted spec it must give or the exact
refusal. Scripts live in corpus/; the cluster is corpus/cluster.toml plus the nodes
below, as their agents announce them (NVML model names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.admission.cluster_shape import NodeShape, shape
from services.admission.config import load_config
from services.admission.sbatch import parse_submission
from services.admission.validate import admit

CORPUS = Path(__file__).parent / "corpus"
CONFIG = load_config((CORPUS / "cluster.toml").read_text())
H100, A100, V100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"
NODES = [
    *(NodeShape(name=f"h0{i}", gpus=8, gpu_model=H100) for i in range(1, 9)),
    *(NodeShape(name=f"a0{i}", gpus=4, gpu_model=A100) for i in range(1, 5)),
    *(NodeShape(name=f"v0{i}", gpus=2, gpu_model=V100) for i in range(1, 3)),
]
CLUSTER = shape(CONFIG, NODES)
HOUR = 3600


def submit(file: str, argv: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    """(the admitted spec or None, every error message: parsing's, then admission's)."""
    path = CORPUS / file
    parsed = parse_submission(
        argv, path.read_bytes(), user="alice", workdir="/w", script_path=str(path), now=1.8e9
    )
    if parsed.spec is None:
        return None, tuple(e.message for e in parsed.errors)
    got = admit(parsed.spec, parsed.explicit, CONFIG, CLUSTER)
    return got.spec, tuple(e.message for e in got.errors)


def g(n: int, model: str | None = None, nodes: int = 1, **more: Any) -> dict[str, Any]:
    """The GPU shape of a spec: per node, the type as written, the node count."""
    return {"gpus_per_node": n, "gpu_model": model, "nodes_min": nodes, "nodes_max": nodes, **more}


# name -> (script, command-line options, the fields the admitted spec must have)
ACCEPTED: dict[str, tuple[str, tuple[str, ...], dict[str, Any]]] = {
    "--gres=gpu:h100:4 on nodes whose NVML model is 'NVIDIA H100 80GB HBM3'": (
        "typed_gres.sh",
        (),
        g(4, "h100", name="llm-sft", time_limit_s=12 * HOUR),
    ),
    "a type in upper case": ("typed_gres_upper.sh", (), g(8, "H100", nodes=2)),
    "--gpus-per-node=a100:2": (
        "gpus_per_node_typed.sh",
        (),
        g(2, "a100", nodes=2, ntasks_per_node=2),
    ),
    "-G h100:16 takes the fewest nodes that hold it": (
        "gpus_total_typed.sh",
        (),
        g(8, "h100", nodes=2, gpus_total=16),
    ),
    "--gpus-per-task=a100:1 with four tasks": (
        "gpus_per_task_typed.sh",
        (),
        g(4, "a100", ntasks_per_node=4, gpus_per_task=1),
    ),
    "the full model written as a GRES type": (
        "full_model_name.sh",
        (),
        g(1, "nvidia_h100_80gb_hbm3"),
    ),
    "a site's own type from the config": (
        "site_gpu_type.sh",
        (),
        g(2, "volta", partition="debug", time_limit_s=600),
    ),
    "--gres=gpu:2 without a type": ("untyped_gres.sh", (), g(2)),
    "-C ib&nvlink": ("constraint_and.sh", (), g(4, nodes=4, constraint="ib&nvlink")),
    "-C 'rack1|rack2' over six nodes": (
        "constraint_or.sh",
        (),
        g(8, nodes=6, constraint="rack1|rack2"),
    ),
    "a matching OR of racks, exclusive": (
        "constraint_matching.sh",
        (),
        g(0, nodes=4, constraint="[rack1|rack2]", exclusive=True),
    ),
    "counts in a matching set": (
        "constraint_counts.sh",
        (),
        g(0, nodes=4, constraint="[rack1*2&rack2*2]"),
    ),
    "a count beside a feature every node has": (
        "constraint_count_and.sh",
        (),
        g(0, nodes=3, constraint="ib&rack1*2"),
    ),
    "a type and a feature together": (
        "constraint_with_type.sh",
        (),
        g(4, "a100", nodes=2, constraint="ib"),
    ),
    "a partition list: the first that fits": (
        "partition_list.sh",
        (),
        g(1, gpus_total=1, partition="debug", partitions=("debug", "gpu"), time_limit_s=600),
    ),
    "a partition list with spaces and a trailing comment": (
        "partition_list_spaces.sh",
        (),
        g(1, gpus_total=1, partition="gpu", partitions=("gpu", "debug")),
    ),
    "comments, blank lines, a disabled ##SBATCH and one after the first command": (
        "comments_and_blanks.sh",
        (),
        g(2, "h100", name="ft", time_limit_s=2 * HOUR),
    ),
    "tabs and trailing spaces": (
        "tabs_and_spaces.sh",
        (),
        g(4, "h100", nodes=2, time_limit_s=1800),
    ),
    "short options with values attached": (
        "attached_short_values.sh",
        (),
        g(4, "h100", nodes=2, gpus_total=8, ntasks_per_node=4, cpus_per_task=4, name="packed"),
    ),
    "long options abbreviated to a unique prefix": (
        "abbreviated_long.sh",
        (),
        g(1, "h100", nodes=2, name="abbrev"),
    ),
    "memory and CPUs beside a typed GPU": (
        "mem_and_cpus.sh",
        (),
        g(1, "h100", mem_mib=200 * 1024, cpus_per_task=16),
    ),
    "an array of typed single-GPU tasks": (
        "array_typed.sh",
        (),
        g(1, "a100", array_spec="0-9%2", array_max_running=2, output="logs/%A_%a.out"),
    ),
    "exclusive nodes with a feature": (
        "exclusive_nodes.sh",
        (),
        g(0, nodes=2, constraint="nvlink", exclusive=True),
    ),
    "named and excluded nodes with a type": (
        "exclude_and_nodelist.sh",
        (),
        g(8, "h100", nodes=2, required_nodes=("h01", "h02"), excluded_nodes=("h08",)),
    ),
    "#MUSTER --torchrun with typed GPUs": (
        "torchrun_typed.sh",
        (),
        g(8, "h100", nodes=2, torchrun=True),
    ),
    "a signal before the end and --requeue": (
        "signal_requeue.sh",
        (),
        g(8, "h100", signal="USR1", signal_before_s=120, signal_batch_only=True, requeue=True),
    ),
    "a dependency and a typed GPU": ("dependency_typed.sh", (), g(1, "a100")),
    "a quoted name and comment": (
        "quoted_name.sh",
        (),
        g(1, "h100", name="sweep lr=3e-4", comment="typed gpus, quoted"),
    ),
    "DOS line endings": ("dos_line_endings.sh", (), g(2, "a100")),
    "a type in mixed case against a lower-case one": ("gpu_type_any_case.sh", (), g(4, "A100")),
    "-t 1-12 is a day and a half": (
        "time_formats.sh",
        (),
        g(4, "h100", time_limit_s=36 * HOUR),
    ),
    "a script with no directive": ("plain.sh", (), g(0, partition="gpu", time_limit_s=HOUR)),
    "many options on one directive": (
        "many_options_one_line.sh",
        (),
        g(4, "h100", nodes=2, ntasks_per_node=4, cpus_per_task=8, time_limit_s=4 * HOUR),
    ),
    "the command line gives a type and a partition list": (
        "plain.sh",
        ("-p", "debug,gpu", "--gres=gpu:h100:2"),
        g(2, "h100", partition="gpu", partitions=("debug", "gpu")),
    ),
    "the command line gives a constraint with separate values": (
        "plain.sh",
        ("-C", "ib&rack2", "-N", "3", "--gpus-per-node", "h100:8"),
        g(8, "h100", nodes=3, constraint="ib&rack2"),
    ),
    "the command line overrides a script's type": (
        "typed_gres.sh",
        ("--gres=gpu:a100:2",),
        g(2, "a100", name="llm-sft"),
    ),
}


@pytest.mark.parametrize("name", ACCEPTED)
def test_accepted(name: str) -> None:
    file, argv, want = ACCEPTED[name]
    spec, errors = submit(file, argv)
    assert errors == ()
    assert {k: getattr(spec, k) for k in want} == want


TYPES_GPU = "a100 (NVIDIA A100-SXM4-80GB), h100 (NVIDIA H100 80GB HBM3)"
FEATURES = "features: ib, nvlink, rack1, rack2"
TOGETHER = "together (counts, or one [..] alternative for all)"

# name -> (script, command-line options, every refusal message, in order)
REFUSED: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "a GPU type no node has lists the types there": (
        "bad_gpu_type.sh",
        (),
        (f"no node in partition 'gpu' has GPU type 'b200'; GPU types there: {TYPES_GPU}",),
    ),
    "a type the partition lacks": (
        "bad_type_in_debug.sh",
        (),
        (
            "no node in partition 'debug' has GPU type 'h100'; GPU types there: "
            "volta (Tesla V100-SXM2-16GB)",
        ),
    ),
    "the derived type is replaced by the site's": (
        "bad_type_replaced_by_site.sh",
        (),
        (
            "no node in partition 'debug' has GPU type 'v100'; GPU types there: "
            "volta (Tesla V100-SXM2-16GB)",
        ),
    ),
    "a feature no node has": (
        "bad_feature.sh",
        (),
        (f"no node in partition 'gpu' matches --constraint 'rack3'; {FEATURES}",),
    ),
    "no rack holds five nodes": (
        "bad_matching_too_big.sh",
        (),
        (
            f"no 5 node(s) in partition 'gpu' satisfy --constraint '[rack1|rack2]' {TOGETHER}; "
            + FEATURES,
        ),
    ),
    "a count over what exists": (
        "bad_count.sh",
        (),
        (
            f"no 6 node(s) in partition 'gpu' satisfy --constraint 'ib&rack1*5' {TOGETHER}; "
            + FEATURES,
        ),
    ),
    "parentheses are not supported": (
        "bad_constraint_syntax.sh",
        (),
        (
            "invalid --constraint '(ib|nvlink)&rack1': expected FEATURE, A&B (all of), "
            "A|B (any of), A*N&B (counts) or [A|B] (matching), e.g. a100&ib",
        ),
    ),
    "a typo in a partition list": (
        "bad_partition_in_list.sh",
        (),
        ("partition list 'gpu,gpuu': no partition 'gpuu'; partitions: gpu, debug, prod",),
    ),
    "a partition in the list the account may not use": (
        "unusable_partition_in_list.sh",
        (),
        (
            "partition list 'gpu,prod': 'prod' is not usable: account 'research' may not use "
            "partition 'prod'; allowed accounts: serving",
        ),
    ),
    "a partition list on the command line": (
        "plain.sh",
        ("-p", "debug,nosuch"),
        ("partition list 'debug,nosuch': no partition 'nosuch'; partitions: gpu, debug, prod",),
    ),
    "more typed nodes than exist": (
        "bad_type_too_many.sh",
        (),
        ("5 nodes asked; partition 'gpu' has 4 node(s) that match the request",),
    ),
    "an unknown partition": (
        "bad_unknown_partition.sh",
        (),
        ("no partition 'nosuch'; partitions: gpu, debug, prod",),
    ),
    "an ambiguous abbreviation": (
        "bad_ambiguous_option.sh",
        (),
        (
            "line 2 (#SBATCH): option '--nod' is ambiguous; possibilities: --nodefile, "
            "--nodelist, --nodes",
        ),
    ),
    "GPUs counted per task and per node": (
        "bad_gpus_counted_twice.sh",
        (),
        ("--gpus-per-task and --gpus/--gpus-per-node/--gres both count GPUs; give one",),
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused(name: str) -> None:
    file, argv, want = REFUSED[name]
    spec, errors = submit(file, argv)
    assert (spec, errors) == (None, want)


def test_the_corpus_is_all_used() -> None:
    used = {f for f, _, _ in ACCEPTED.values()} | {f for f, _, _ in REFUSED.values()}
    assert used == {p.name for p in CORPUS.glob("*.sh")}
    assert len(ACCEPTED) + len(REFUSED) >= 40
