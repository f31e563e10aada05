#!/usr/bin/env python3
"""A Ray driver for `muster submit --ray`: it sees the allocation's nodes in
`ray.nodes()`, runs one task pinned to each, and prints where they ran.

    muster submit --ray -N 2 --gpus-per-node=1 examples/ray_driver.py [SLEEP_S]

With SLEEP_S the first attempt then sleeps that long (a window for a fault test)."""

from __future__ import annotations

import os
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=1)
def where() -> tuple[str, str]:
    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), os.environ.get("CUDA_VISIBLE_DEVICES", "")


def main() -> None:
    ray.init()  # RAY_ADDRESS, set by Muster
    nodes = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]  # ray: none
    pinned = [
        where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
        for n in nodes
    ]
    ran = ray.get([task.remote() for task in pinned])
    gpus = sum(int(n["Resources"].get("GPU", 0)) for n in nodes)
    attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
    print(
        f"attempt={attempt} nodes={len(nodes)} tasks_on={len({r[0] for r in ran})} gpus={gpus}",
        flush=True,
    )
    if attempt == "0" and len(sys.argv) > 1:
        time.sleep(float(sys.argv[1]))
    print(f"attempt={attempt} done", flush=True)


if __name__ == "__main__":
    main()
