"""Replays one workload under variants of MUSTER_POLICY: the tables of docs/sim-report.md,
*Issue 20, continued*.

    .venv/bin/python bench/sim_variants.py philly 72 --limit 10000 \\
        easy muster pack_small=False gang_leaf_wait_s=3600 protect_oldest=True
    .venv/bin/python bench/sim_variants.py kalos 32 --speedup 10 muster age_ref_gpus=8
    .venv/bin/python bench/sim_variants.py llm-mix 64 easy slurm muster

A variant is a policy name (fifo, easy, slurm, muster) or FIELD=VALUE[:FIELD=VALUE...]
over MUSTER_POLICY. One line per variant, then ONE JSON line with every result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from services.placer.core import MUSTER_POLICY, PolicyConfig
from sim import POLICIES, load, make_cluster, run
from sim.llm_mix import llm_mix
from sim.traces import traces_root
from sim.workload import TraceJob

TRACES = {"philly": "philly/philly.csv", "kalos": "acme/kalos_converted.csv"}


def policy(variant: str) -> str | PolicyConfig:
    if variant in POLICIES:
        return variant
    fields: dict[str, Any] = {}
    for part in variant.split(":"):
        name, _, text = part.partition("=")
        default = getattr(MUSTER_POLICY, name)
        if text == "None":
            fields[name] = None
        elif isinstance(default, bool):
            fields[name] = text == "True"
        elif isinstance(default, int) and not isinstance(default, bool):
            fields[name] = int(text)
        else:
            fields[name] = float(text)
    return msgspec.structs.replace(MUSTER_POLICY, **fields)


def workload(args: argparse.Namespace) -> list[TraceJob]:
    if args.workload == "llm-mix":
        return llm_mix(days=60, nodes=args.nodes, load=0.8, seed=0)
    jobs = load(traces_root() / TRACES[args.workload], args.workload, args.limit)
    if args.speedup != 1.0:
        jobs = [msgspec.structs.replace(j, submit_s=j.submit_s / args.speedup) for j in jobs]
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=[*TRACES, "llm-mix"])
    ap.add_argument("nodes", type=int, help="8 GPUs a node, 8 nodes a leaf, 4 leaves a spine")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--limit", type=int, help="the first N jobs of the trace")
    ap.add_argument("--speedup", type=float, default=1.0)
    args = ap.parse_args()
    jobs = workload(args)
    cluster = make_cluster(nodes=args.nodes, nodes_per_leaf=8, leaves_per_spine=4)
    out = []
    for variant in args.variants:
        r = msgspec.to_builtins(run(jobs, cluster, policy(variant)))
        r["variant"] = variant
        del r["gpu_seconds_by_account"]
        print(
            f"{variant}: mean {r['queue_delay_mean_s']:,.0f} s, p99 "
            f"{r['queue_delay_p99_s']:,.0f} s, one leaf {r['multi_node_in_one_leaf']}",
            flush=True,
        )
        out.append(r)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
