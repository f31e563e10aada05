"""`muster sim`: replay a trace under one or all policies and print what happened.

muster sim philly.csv --format philly --nodes 96 --policy all
muster sim pods.csv --format openb            # cluster from the node list beside it
muster sim jobs.csv --format csv --topology cluster.toml --json
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from services.placer.core import Node
from sim.cluster import load_topology, make_cluster, openb_cluster
from sim.engine import POLICIES, run
from sim.limits import LimitMode, LimitModel
from sim.metrics import SimResult
from sim.workload import FORMATS, load

OPENB_NODES = "openb_node_list_gpu_node.csv"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="muster sim",
        description=__doc__.splitlines()[0],
        epilog="csv format: a header, then submit_time,duration_s,nodes,gpus_per_node,user,"
        "account[,time_limit_s] (seconds). Topology files: see sim/cluster.py and "
        "sim/topologies/. Without --topology or --nodes: openb uses the node list beside "
        "the pod list, others 64 nodes.",
    )
    p.add_argument("trace", type=Path, help="trace file")
    p.add_argument("--format", choices=FORMATS, default="csv", help="trace format")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--topology", type=Path, help="cluster topology TOML file")
    where.add_argument("--nodes", type=int, help="a regular cluster of this many nodes")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes-per-leaf", type=int, default=8)
    p.add_argument("--leaves-per-spine", type=int, default=4)
    p.add_argument("--policy", choices=[*POLICIES, "all"], default="muster")
    p.add_argument("--limit", type=int, help="replay only the first N jobs")
    p.add_argument(
        "--speedup", type=float, default=1.0, help="divide submit times by this (more load)"
    )
    p.add_argument("--queue-depth", type=int, default=100, help="jobs each pass looks at")
    p.add_argument("--mtbf", type=float, help="node mean time between failures, seconds")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure and limit draws")
    p.add_argument(
        "--limits",
        choices=[m.value for m in LimitMode],
        default=LimitMode.REALISTIC.value,
        help="time limits of jobs the trace gives none: drawn over-estimates (realistic, "
        "see sim/limits.py) or exactly --limit-factor x the runtime (padded)",
    )
    p.add_argument("--limit-factor", type=float, default=1.5, help="padded limits only")
    p.add_argument("--json", action="store_true", help="print results as one JSON line")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write charts here (matplotlib)")
    return p


def cluster_for(args: argparse.Namespace) -> tuple[Node, ...]:
    if args.topology is not None:
        return load_topology(args.topology)
    if args.nodes is None and args.format == "openb":
        beside = args.trace.parent / OPENB_NODES
        if beside.exists():
            return openb_cluster(beside)
    return make_cluster(
        nodes=args.nodes or 64,
        gpus_per_node=args.gpus_per_node,
        nodes_per_leaf=args.nodes_per_leaf,
        leaves_per_spine=args.leaves_per_spine,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        jobs = load(args.trace, args.format, args.limit)
        if args.speedup != 1.0:
            jobs = [msgspec.structs.replace(j, submit_s=j.submit_s / args.speedup) for j in jobs]
        cluster = cluster_for(args)
    except (OSError, ValueError, KeyError) as err:
        print(f"muster sim: cannot read input: {err}", file=sys.stderr)
        return 2
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    results = [
        run(
            jobs,
            cluster,
            name,
            mtbf_s=args.mtbf,
            rng=random.Random(args.seed) if args.mtbf else None,
            queue_depth=args.queue_depth,
            limits=LimitModel(
                mode=LimitMode(args.limits), seed=args.seed, factor=args.limit_factor
            ),
        )
        for name in policies
    ]
    if args.json:
        print(json.dumps(msgspec.to_builtins(results)))
    else:
        gpus = sum(len(n.gpus) for n in cluster)
        print(f"{len(jobs)} jobs on {len(cluster)} nodes / {gpus} GPUs, {args.limits} limits")
        print(table(results))
    if args.plot is not None:
        return plot(results, args.plot)
    return 0


ROWS = [
    ("queue delay mean (s)", "queue_delay_mean_s"),
    ("queue delay median (s)", "queue_delay_median_s"),
    ("queue delay p99 (s)", "queue_delay_p99_s"),
    ("JCT mean (s)", "jct_mean_s"),
    ("GPU utilization", "gpu_utilization"),
    ("multi-node in one leaf", "multi_node_in_one_leaf"),
    ("  of those a leaf holds", "multi_node_fitting_in_one_leaf"),
    ("longest wait >=64 GPUs (s)", "longest_wait_64gpu_s"),
    ("start estimate error med (s)", "estimate_error_median_s"),
    ("start estimate error p90 (s)", "estimate_error_p90_s"),
    ("preemptions", "preemptions"),
    ("never started", "never_started"),
    ("place() calls", "passes"),
    ("wall time (s)", "wall_s"),
]


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def table(results: list[SimResult]) -> str:
    head = f"{'':28}" + "".join(f"{r.policy:>14}" for r in results)
    lines = [head]
    for label, field in ROWS:
        cells = "".join(f"{_fmt(getattr(r, field)):>14}" for r in results)
        lines.append(f"{label:28}{cells}")
    prod = results[0] if results else None
    if prod is not None and prod.production_delay_mean_s is not None:
        lines.append(
            f"production delay mean/median/p99 (s): {prod.production_delay_mean_s:,.0f} / "
            f"{prod.production_delay_median_s or 0:,.0f} / {prod.production_delay_p99_s or 0:,.0f}"
        )
    return "\n".join(lines)


def plot(results: list[SimResult], out: Path) -> int:
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        print("muster sim: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    names = [r.policy for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for k, field in enumerate(("queue_delay_mean_s", "queue_delay_median_s")):
        xs = [x + 0.4 * k for x in range(len(names))]
        axes[0].bar(xs, [getattr(r, field) for r in results], 0.4, label=field)
    axes[0].set_xticks(range(len(names)), names)
    axes[0].set_title("queueing delay (s)")
    axes[0].legend()
    axes[1].bar(names, [r.gpu_utilization for r in results])
    axes[1].set_title("GPU utilization")
    fig.tight_layout()
    fig.savefig(out / "policies.png")
    print(f"wrote {out / 'policies.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
