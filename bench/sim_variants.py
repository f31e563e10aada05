"""Replays one workload under variants of MUSTER_POLICY: the tables of docs/sim-report.md,
*Issue 20, continued*.

    .venv/bin/python bench/sim_variants.py philly 72 --limit 10000 \\
        easy muster pack_small=False gang_leaf_wait_s=3600 protect_oldest=True
    .venv/bin/python bench/sim_variants.py kalos 32 --speedup 10 muster age_ref_gpus=8
    .venv/bin/python bench/sim_variants.py llm-mix 64 easy slurm muster

A variant is a policy name (fifo, easy, slurm, muster) or FIELD=VALUE[:FIELD=VALUE...]
over MUSTER_POLICY. One line per variant, then ONE JSON line with every result.

`--seeds N` replays each variant under the limits of seeds 0..N-1 (sim/limits.py: each
job's drawn limit changes with the seed; one seed is one draw of how users guessed) and
against easy under the same limits: one line per variant with the mean over the seeds of
its mean and p99 delay against easy's, its jobs of >= 64 GPUs waiting over 1.5x their
easy wait (+60 s), and each seed's figures; the JSON holds the same per seed.

    .venv/bin/python bench/sim_variants.py kalos 32 --speedup 10 --seeds 10 \\
        muster order_trust=1
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
from sim import POLICIES, SimResult, load, make_cluster, run
from sim.limits import LimitModel
from sim.llm_mix import llm_mix
from sim.metrics import wide_over
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


def against(r: SimResult, easy: SimResult) -> dict[str, float]:
    """`r` against easy's replay of the same jobs under the same limits."""
    return {
        "mean_vs_easy": r.queue_delay_mean_s / easy.queue_delay_mean_s - 1,
        "p99_vs_easy": r.queue_delay_p99_s / easy.queue_delay_p99_s - 1,
        "jct_vs_easy": r.jct_mean_s / easy.jct_mean_s - 1,
        "wide_over": len(wide_over(r, easy)),
        "wide": len(r.waits_64gpu_s),
        "one_leaf": r.multi_node_in_one_leaf or 0.0,
        "one_leaf_fitting": r.multi_node_fitting_in_one_leaf or 0.0,
    }


def over_seeds(
    jobs: list[TraceJob], cluster: Any, variants: list[str], seeds: int
) -> list[dict[str, Any]]:
    """Each variant against easy under the limits of seeds 0..seeds-1."""
    limits = [LimitModel(seed=s) for s in range(seeds)]
    easy = [run(jobs, cluster, "easy", limits=lm) for lm in limits]
    out = []
    for variant in variants:
        rows = [
            against(run(jobs, cluster, policy(variant), limits=lm), e)
            for lm, e in zip(limits, easy, strict=True)
        ]
        mean = {k: sum(r[k] for r in rows) / seeds for k in rows[0]}
        each = " ".join(
            f"{r['mean_vs_easy']:+.0%}/{r['p99_vs_easy']:+.0%}/{r['wide_over']}" for r in rows
        )
        print(
            f"{variant}: over {seeds} seeds, mean delay {mean['mean_vs_easy']:+.1%} of easy's,"
            f" p99 {mean['p99_vs_easy']:+.1%}, JCT {mean['jct_vs_easy']:+.1%},"
            f" wide over 1.5x {mean['wide_over']:.1f} of {rows[0]['wide']}"
            f" (most {max(r['wide_over'] for r in rows)}), one leaf {mean['one_leaf']:.3f}"
            f" ({mean['one_leaf_fitting']:.3f} of gangs a leaf holds);"
            f" per seed mean/p99/wide: {each}",
            flush=True,
        )
        out.append({"variant": variant, "seeds": seeds, "mean": mean, "per_seed": rows})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=[*TRACES, "llm-mix"])
    ap.add_argument("nodes", type=int, help="8 GPUs a node, 8 nodes a leaf, 4 leaves a spine")
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--limit", type=int, help="the first N jobs of the trace")
    ap.add_argument("--speedup", type=float, default=1.0)
    ap.add_argument("--seeds", type=int, help="each variant against easy under N limit seeds")
    args = ap.parse_args()
    jobs = workload(args)
    cluster = make_cluster(nodes=args.nodes, nodes_per_leaf=8, leaves_per_spine=4)
    if args.seeds:
        print(json.dumps(over_seeds(jobs, cluster, args.variants, args.seeds)))
        return
    out = []
    for variant in args.variants:
        r = msgspec.to_builtins(run(jobs, cluster, policy(variant)))
        r["variant"] = variant
        del r["gpu_seconds_by_account"]
        print(
            f"{variant}: mean {r['queue_delay_mean_s']:,.0f} s, p99 "
            f"{r['queue_delay_p99_s']:,.0f} s, one leaf {r['multi_node_in_one_leaf']}"
            f" ({r['multi_node_fitting_in_one_leaf']} of gangs a leaf holds)",
            flush=True,
        )
        out.append(r)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
