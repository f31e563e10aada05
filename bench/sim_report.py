"""Runs the simulator experiments behind docs/sim-report.md and prints their tables.

    .venv/bin/python bench/sim_report.py [--quick] [--only philly|kalos|llm-mix|openb]

Each experiment replays one trace on one cluster under fifo, easy, slurm and muster, with
realistic (drawn) time limits (sim/limits.py); figures
are printed as a markdown table, then ONE JSON line with every result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from services.placer.core import Node
from sim import POLICIES, SimResult, load, make_cluster, openb_cluster, run
from sim.llm_mix import llm_mix
from sim.metrics import wide_over
from sim.traces import TracesMissing, traces_root
from sim.workload import TraceJob


def tree(nodes: int) -> tuple[Node, ...]:
    """A regular cluster: 8 nodes a leaf switch, 4 leaves a spine."""
    return make_cluster(nodes=nodes, nodes_per_leaf=8, leaves_per_spine=4)


def experiments(quick: bool) -> dict[str, tuple[list[TraceJob], tuple[Node, ...]]]:
    limit = 10_000 if quick else None
    try:
        root = traces_root()
    except TracesMissing as missing:
        sys.exit(f"sim_report: {missing}")
    philly = load(root / "philly/philly.csv", "philly", limit)
    kalos = load(root / "acme/kalos_converted.csv", "kalos")
    kalos_x10 = [msgspec.structs.replace(j, submit_s=j.submit_s / 10) for j in kalos]
    openb = load(root / "alibaba/openb_pod_list_default.csv", "openb", limit)
    return {
        "philly, 96 nodes x 8 GPUs": (philly, tree(96)),
        "philly, 72 nodes x 8 GPUs": (philly, tree(72)),
        "kalos, 302 nodes x 8 GPUs (production size)": (kalos, tree(302)),
        "kalos x10 arrival rate, 32 nodes x 8 GPUs": (kalos_x10, tree(32)),
        "llm-mix (sim/llm_mix.py, 60 days, load 0.8), 64 nodes x 8 GPUs": (
            llm_mix(days=60, nodes=64, load=0.8, seed=0),
            tree(64),
        ),
        "openb, its 1,213 nodes / 6,212 GPUs": (
            openb,
            openb_cluster(root / "alibaba/openb_node_list_gpu_node.csv"),
        ),
    }


ROWS = [
    ("delay mean (s)", "queue_delay_mean_s"),
    ("delay median (s)", "queue_delay_median_s"),
    ("delay p99 (s)", "queue_delay_p99_s"),
    ("JCT mean (s)", "jct_mean_s"),
    ("GPU util", "gpu_utilization"),
    ("multi-node in 1 leaf", "multi_node_in_one_leaf"),
    ("multi-node in 1 leaf, of gangs 1 leaf holds", "multi_node_fitting_in_one_leaf"),
    ("longest wait >=64 GPUs (s)", "longest_wait_64gpu_s"),
    ("first start estimate error median (s)", "estimate_error_median_s"),
    ("first start estimate error p90 (s)", "estimate_error_p90_s"),
    ("place() calls", "passes"),
    ("wall (s)", "wall_s"),
]


def cell(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def markdown(title: str, results: list[SimResult]) -> str:
    lines = [f"### {title}", "", "| | " + " | ".join(r.policy for r in results) + " |"]
    lines.append("|---|" + "---:|" * len(results))
    for label, field in ROWS:
        lines.append(f"| {label} | " + " | ".join(cell(getattr(r, field)) for r in results) + " |")
    lines.append(f"| >=64-GPU jobs waiting > 1.5 x their easy wait | {wide_starved(results)} |")
    return "\n".join(lines)


def wide_starved(results: list[SimResult]) -> str:
    """The issue's bar, per policy: its jobs of >= 64 GPUs over 1.5 x their easy wait."""
    easy = next((r for r in results if r.policy == "easy"), None)
    if easy is None:
        return "-"
    return " | ".join(str(len(wide_over(r, easy))) for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="first 10,000 jobs of the big traces")
    ap.add_argument("--only", help="run experiments whose title contains this")
    args = ap.parse_args()
    everything = {}
    for title, (jobs, cluster) in experiments(args.quick).items():
        if args.only and args.only not in title:
            continue
        began = time.perf_counter()
        results = [run(jobs, cluster, policy) for policy in POLICIES]
        print(markdown(f"{title}: {len(jobs)} jobs", results), flush=True)
        print(f"\n({time.perf_counter() - began:.0f} s for the runs)\n", flush=True)
        everything[title] = msgspec.to_builtins(results)
    everything["traces"] = str(traces_root())
    print(json.dumps(everything))


if __name__ == "__main__":
    main()
