"""Benchmark: what `--constraint` feature counts and matching ORs cost the placer.

The cluster, running jobs and queue of bench/placer_scale.py (10,000 nodes x 8 GPUs,
70% busy, 50,000 pending jobs sized from the Kalos trace), with node features: `b` on
three nodes in four, `a` on one in four, and a rack (`rack0`..`rack7`, by pod). Then
`--share` of the pending jobs carry a constraint drawn from `b`, `a*2&b`, `[rackN|rackM]`
and `a*1&b*1`; times one full pass against the same queue without constraints, and one
counted job placed on the prepared busy cluster. Prints figures, then ONE JSON line:

    .venv/bin/python bench/constraint_counts.py [--nodes 10000] [--pending 50000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.placer_scale import T0, acme_sizes, cluster, fill, kalos_path, request
from services.placer.core import MUSTER_POLICY, JobRequest, Node, Snapshot, place
from services.placer.core.place import prepare


def featured(nodes: tuple[Node, ...], rng: random.Random) -> tuple[Node, ...]:
    out = []
    for n in nodes:
        feats = [f"rack{int(n.topology[0][3:]) % 8}"]
        feats += ["b"] if rng.random() < 0.75 else []
        feats += ["a"] if rng.random() < 0.25 else []
        out.append(msgspec.structs.replace(n, features=tuple(feats)))
    return tuple(out)


def constrained(job: JobRequest, rng: random.Random) -> JobRequest:
    racks = rng.sample(range(8), 2)
    text = rng.choice(["b", "a*2&b", f"[rack{racks[0]}|rack{racks[1]}]", "a*1&b*1"])
    if "*2" in text and job.nodes_min < 2:  # a count of 2 needs a gang of 2 or more
        job = msgspec.structs.replace(job, nodes_min=2, nodes_max=2, gpus_total=None)
        job = msgspec.structs.replace(job, gpus_per_node=max(job.gpus_per_node, 1))
    return msgspec.structs.replace(job, constraint=text)


def best(snap: Snapshot, pending: list[JobRequest], repeat: int) -> tuple[float, int]:
    times, starts = [], 0
    for _ in range(repeat):
        t = time.perf_counter()
        plan = place(snap, pending, now=T0, config=MUSTER_POLICY)
        times.append(time.perf_counter() - t)
        starts = len(plan.starts)
    return min(times), starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--share", type=float, default=0.1, help="pending jobs with a constraint")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = random.Random(7)
    sizes = acme_sizes(kalos_path())
    nodes = featured(cluster(args.nodes), rng)
    snap = Snapshot(nodes=nodes, running=fill(nodes, 0.7, rng, sizes))
    plain = [request(10_000_000 + i, rng, sizes) for i in range(args.pending)]
    mixed = [constrained(j, rng) if rng.random() < args.share else j for j in plain]
    plain_s, plain_starts = best(snap, plain, args.repeat)
    mixed_s, mixed_starts = best(snap, mixed, args.repeat)
    prep = prepare(snap, T0, MUSTER_POLICY)
    one = []
    for i in range(200):
        job = request(20_000_000 + i, rng, sizes)
        job = msgspec.structs.replace(
            job, nodes_min=2, nodes_max=2, gpus_per_node=4, gpus_total=None, constraint="a*2&b"
        )
        t = time.perf_counter()
        prep.place_one(job)
        one.append(time.perf_counter() - t)
    out = {
        "nodes": args.nodes,
        "pending_jobs": args.pending,
        "constrained_jobs": sum(1 for j in mixed if j.constraint),
        "full_pass_plain_s": round(plain_s, 3),
        "full_pass_constrained_s": round(mixed_s, 3),
        "starts_plain": plain_starts,
        "starts_constrained": mixed_starts,
        "one_counted_job_ms": round(statistics.median(one) * 1000, 3),
        "one_counted_job_p99_ms": round(sorted(one)[int(len(one) * 0.99) - 1] * 1000, 3),
    }
    for k, v in out.items():
        print(f"{k:>26}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
