"""Benchmark: one placer pass at scale, and one job placed on a busy cluster.

Builds 10,000 nodes x 8 GPUs under a 3-level switch tree (pod / spine / leaf, 32 nodes a
leaf), fills 70% of the GPUs with running jobs, queues 50,000 pending jobs whose GPU
counts and runtimes are drawn from the Acme (Kalos) trace, then times:

- full pass: place(snapshot, pending, now) with backfill, bookings and preemption checks,
  index build included: best of --repeat (the node skeleton is cached after the first:
  `full_pass_cold_s` is the first), and with max_job_test unlimited (best of --repeat,
  and the median);
- one job: Prepared.place_one(job) on a prepared busy cluster (the incremental path);
- the queue order alone (order.ranked, predictions included, the collector paused as in
  a pass): `rank_s`, the part of a pass that is the same whatever the cluster holds.

Predictions included, as the placer service runs a cycle: a predictor learned from a
history of 2,000 finished jobs (the service's window) gives every pending and running
job it can its predicted runtime (`predict.with_predictions`) before each pass, and the
passes' times include that step (`predict_s` alone). Job names and the history are drawn
from a second seeded generator, so the cluster and the queue are the same jobs as
without them.

Prints figures, then ONE JSON line. Usage:
    .venv/bin/python bench/placer_scale.py [--nodes 10000] [--pending 50000] [--busy 0.7]
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from services.placer.core import (
    MUSTER_POLICY,
    Gpu,
    Grant,
    JobRequest,
    Node,
    PolicyConfig,
    Running,
    Snapshot,
    place,
)
from services.placer.core.gc_pause import gc_paused
from services.placer.core.order import ranked
from services.placer.core.place import prepare
from services.placer.core.predict import Outcome, Predictor, with_predictions
from sim.traces import TracesMissing, traces_root

KALOS = "acme/kalos_converted.csv"
T0 = 1_700_000_000.0


def acme_sizes(path: Path) -> list[tuple[int, float]]:
    """(GPUs, runtime seconds) of the Kalos jobs."""
    with path.open() as f:
        return [(int(r["gpu_workers"]), float(r["num_iteration"]) * 0.5) for r in csv.DictReader(f)]


def kalos_path() -> Path:
    """The Kalos trace, or exit non-zero saying where it was looked for."""
    try:
        path = traces_root() / KALOS
    except TracesMissing as missing:
        sys.exit(f"placer_scale: {missing}")
    if not path.is_file():
        sys.exit(f"placer_scale: {path} is missing: the job sizes are drawn from it")
    return path


def cluster(n: int, gpus: int = 8) -> tuple[Node, ...]:
    per_leaf, leaves_per_spine, spines_per_pod = 32, 4, 8
    out = []
    for i in range(n):
        leaf = i // per_leaf
        spine = leaf // leaves_per_spine
        path = (f"pod{spine // spines_per_pod}", f"spine{spine}", f"leaf{leaf}")
        gpu_list = tuple(Gpu(index=g, locality=g // 4) for g in range(gpus))
        out.append(Node(name=f"node{i:05d}", gpus=gpu_list, topology=path))
    return tuple(out)


def fill(
    nodes: tuple[Node, ...], busy: float, rng: random.Random, sizes: list[tuple[int, float]]
) -> tuple[Running, ...]:
    """Running jobs packed node by node until `busy` of the GPUs are taken."""
    total = sum(len(n.gpus) for n in nodes)
    target = int(total * busy)
    running: list[Running] = []
    cursor, used_on_node, used = 0, 0, 0
    order = list(range(len(nodes)))
    rng.shuffle(order)  # busy nodes scattered across switches, as after a long uptime
    while used < target and cursor < len(order):
        want, runtime = rng.choice(sizes)
        grants = []
        while want > 0 and cursor < len(order):
            take = min(want, 8 - used_on_node)
            name = nodes[order[cursor]].name
            grants.append(Grant(node=name, gpus=tuple(range(used_on_node, used_on_node + take))))
            want -= take
            used += take
            used_on_node += take
            if used_on_node == 8:
                cursor, used_on_node = cursor + 1, 0
        started = T0 - rng.uniform(0, runtime)
        running.append(
            Running(
                job_id=len(running) + 1,
                user=f"u{rng.randrange(200)}",
                account=f"a{rng.randrange(20)}",
                started_at=started,
                time_limit_s=int(runtime * 1.5) + 60,
                grants=tuple(grants),
            )
        )
    return tuple(running)


NAMES = 50  # job names per user the history and the queue draw from
HISTORY = 2_000  # finished jobs the predictor learns (the service's window)


def history(rng: random.Random, sizes: list[tuple[int, float]]) -> Predictor:
    """A predictor that learned `HISTORY` finished jobs of the queue's users and sizes,
    each run a random share of its Kalos runtime (most jobs end well before their
    limit)."""
    predictor = Predictor(window=HISTORY)
    for _ in range(HISTORY):
        gpus, runtime = rng.choice(sizes)
        predictor.learn(
            Outcome(
                user=f"u{rng.randrange(200)}",
                name=f"job{rng.randrange(NAMES)}",
                gpus=gpus,
                limit_s=int(runtime * 1.5) + 60,
                runtime_s=max(1.0, runtime * rng.uniform(0.05, 1.0)),
            )
        )
    return predictor


def named(jobs: list[JobRequest], rng: random.Random) -> list[JobRequest]:
    return [msgspec.structs.replace(j, name=f"job{rng.randrange(NAMES)}") for j in jobs]


def predicted(
    predictor: Predictor, snap: Snapshot, pending: list[JobRequest]
) -> tuple[Snapshot, list[JobRequest]]:
    """What a service cycle places: the queue and the running jobs with predictions."""
    jobs, runs = with_predictions(predictor, pending, snap.running)
    return msgspec.structs.replace(snap, running=runs), jobs


def request(job_id: int, rng: random.Random, sizes: list[tuple[int, float]]) -> JobRequest:
    gpus, runtime = rng.choice(sizes)
    shape: dict[str, int | None]
    if gpus <= 8:
        shape = {"gpus_per_node": gpus}
    elif gpus % 8 == 0:
        shape = {"nodes_min": gpus // 8, "nodes_max": gpus // 8, "gpus_per_node": 8}
    else:
        shape = {"gpus_total": gpus}
    urgent = rng.random() < 0.03  # enough tier-1 demand to need preemption
    return JobRequest(
        job_id=job_id,
        user=f"u{rng.randrange(200)}",
        account=f"a{rng.randrange(20)}",
        tier=1 if urgent else 0,
        can_preempt=urgent,
        priority=rng.random(),
        submitted_at=T0 - rng.uniform(0, 86_400),
        time_limit_s=int(runtime * 1.5) + 60,
        **shape,  # type: ignore[arg-type]
    )


def with_memory(
    snap: Snapshot, pending: list[JobRequest], per_gpu_mib: int, skew: bool = False
) -> tuple[Snapshot, list[JobRequest]]:
    """Nodes of 8 x `per_gpu_mib`, and every job asking `per_gpu_mib` per GPU of a node,
    as admission fills --mem from a partition's `def_mem_per_gpu`: a job with the same
    GPUs on each node (a running one whose grants are all alike), not a GPU total spread
    unevenly, whose GPUs per node are not known at submission. `skew`: those too, per
    GPU of their fullest node (or 8), asking more than their share of some nodes."""
    nodes = tuple(msgspec.structs.replace(n, memory_mib=8 * per_gpu_mib) for n in snap.nodes)
    running = tuple(
        msgspec.structs.replace(
            r, mem_per_node_mib=per_gpu_mib * max(len(g.gpus) for g in r.grants)
        )
        if skew or len({len(g.gpus) for g in r.grants}) == 1
        else r
        for r in snap.running
    )
    asks = [
        msgspec.structs.replace(
            j, mem_per_node_mib=per_gpu_mib * (j.gpus_per_node or min(8, j.gpus_total or 1))
        )
        if skew or j.gpus_total is None
        else j
        for j in pending
    ]
    return msgspec.structs.replace(snap, nodes=nodes, running=running), asks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--busy", type=float, default=0.7)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--policy",
        choices=("muster", "mechanism"),
        default="muster",
        help="muster: the service's MUSTER_POLICY; mechanism: PolicyConfig() (old order)",
    )
    ap.add_argument(
        "--mem-per-gpu-gib",
        type=int,
        default=0,
        help="every job asks this much memory per GPU of a node (a partition's"
        " def_mem_per_gpu), nodes have 8 times it: memory counted out for every job",
    )
    ap.add_argument(
        "--mem-skew",
        action="store_true",
        help="with --mem-per-gpu-gib: jobs spread unevenly over nodes ask it per GPU of"
        " their fullest node, so memory, not GPUs, keeps jobs off many busy nodes",
    )
    args = ap.parse_args()
    rng = random.Random(7)
    trace = kalos_path()
    sizes = acme_sizes(trace)
    nodes = cluster(args.nodes)
    snap = Snapshot(nodes=nodes, running=fill(nodes, args.busy, rng, sizes))
    pending = [request(10_000_000 + i, rng, sizes) for i in range(args.pending)]
    if args.mem_per_gpu_gib:
        snap, pending = with_memory(snap, pending, args.mem_per_gpu_gib * 1024, args.mem_skew)
    names = random.Random(8)
    pending = named(pending, names)
    predictor = history(names, sizes)
    gc.collect()
    default = MUSTER_POLICY if args.policy == "muster" else PolicyConfig()
    unlimited = msgspec.structs.replace(default, max_job_test=10**9)
    passes, plan, predicts = [], None, []
    for _ in range(args.repeat):
        t = time.perf_counter()
        seen, jobs = predicted(predictor, snap, pending)
        predicts.append(time.perf_counter() - t)
        plan = place(seen, jobs, now=T0, config=default)
        passes.append(time.perf_counter() - t)
    unlimited_runs, full = [], None
    for _ in range(args.repeat):  # best of --repeat, as the limited pass
        t = time.perf_counter()
        seen, jobs = predicted(predictor, snap, pending)
        full = place(seen, jobs, now=T0, config=unlimited)
        unlimited_runs.append(time.perf_counter() - t)
    assert full is not None
    assert plan is not None
    seen, jobs = predicted(predictor, snap, pending)
    ranks = []
    for _ in range(args.repeat):
        with gc_paused():  # as inside a pass
            t = time.perf_counter()
            ranked(jobs, T0, unlimited)
            ranks.append(time.perf_counter() - t)
    t = time.perf_counter()
    prep = prepare(seen, T0, default)
    prepare_s = time.perf_counter() - t
    one = []
    for i in range(200):
        job = named([request(20_000_000 + i, rng, sizes)], names)
        t = time.perf_counter()
        (ask,), _ = with_predictions(predictor, job, ())
        prep.place_one(ask)
        one.append(time.perf_counter() - t)
    busy_gpus = sum(len(g.gpus) for r in snap.running for g in r.grants)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {
        "job_sizes_from": f"{KALOS} ({len(sizes)} jobs)",
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "busy_fraction": round(busy_gpus / (args.nodes * 8), 3),
        "running_jobs": len(snap.running),
        "pending_jobs": len(pending),
        "full_pass_s": round(min(passes), 3),
        "full_pass_cold_s": round(passes[0], 3),  # includes building the node skeleton
        "full_pass_unlimited_s": round(min(unlimited_runs), 3),
        "full_pass_unlimited_median_s": round(statistics.median(unlimited_runs), 3),
        "predict_s": round(min(predicts), 3),  # with_predictions alone, inside each pass
        "predicted_pending": sum(j.predicted_s is not None for j in jobs),
        "predicted_running": sum(r.predicted_s is not None for r in seen.running),
        "prepare_s": round(prepare_s, 3),
        "rank_s": round(min(ranks), 3),
        "one_job_ms": round(statistics.median(one) * 1000, 3),
        "one_job_p99_ms": round(sorted(one)[int(len(one) * 0.99) - 1] * 1000, 3),
        "starts": len(plan.starts),
        "starts_unlimited": len(full.starts),
        "preemptions": len(plan.preemptions),
        "waits": len(plan.waits),
        "peak_mem_mib": round(peak, 1),
    }
    for k, v in out.items():
        print(f"{k:>24}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
