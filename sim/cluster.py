"""Simulated clusters: a switch tree from a small TOML file, or a regular one from numbers.

Topology file format (every key optional unless marked):

    gpus_per_node = 8        # default for every node
    gpu_model = "A100"
    locality_groups = 2      # NVLink/NUMA groups per node, GPUs split evenly
    node_prefix = "node"     # nodes are named <prefix>0000, <prefix>0001, ...

    [[switch]]               # a top-level switch; switches nest to any depth
    name = "spine0"          # required
      [[switch.switch]]
      name = "leaf0"
      nodes = 16             # nodes hanging off this switch
      gpus_per_node = 4      # overrides the default for these nodes
      block = "nvl0"         # optional NVLink domain of these nodes

A node's topology is the path of switch names from the root to the switch it hangs off.
"""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path
from typing import Any

from services.placer.core import Gpu, Node


def gpus(count: int, model: str = "sim", groups: int = 1) -> tuple[Gpu, ...]:
    per_group = max(1, count // max(groups, 1))
    return tuple(Gpu(index=i, model=model, locality=i // per_group) for i in range(count))


def make_cluster(
    nodes: int,
    gpus_per_node: int = 8,
    nodes_per_leaf: int = 32,
    leaves_per_spine: int = 0,
    gpu_model: str = "sim",
    locality_groups: int = 2,
) -> tuple[Node, ...]:
    """`nodes` nodes, `nodes_per_leaf` under each leaf, leaves under spines if asked."""
    out = []
    for i in range(nodes):
        leaf = i // max(nodes_per_leaf, 1)
        path: tuple[str, ...] = (f"leaf{leaf}",)
        if leaves_per_spine > 0:
            path = (f"spine{leaf // leaves_per_spine}", *path)
        out.append(
            Node(
                name=f"node{i:05d}",
                gpus=gpus(gpus_per_node, gpu_model, locality_groups),
                topology=path,
            )
        )
    return tuple(out)


def load_topology(path: str | Path) -> tuple[Node, ...]:
    """Nodes from a topology TOML file (format in the module docstring)."""
    with Path(path).open("rb") as f:
        spec = tomllib.load(f)
    defaults = {
        "gpus_per_node": int(spec.get("gpus_per_node", 8)),
        "gpu_model": str(spec.get("gpu_model", "sim")),
        "locality_groups": int(spec.get("locality_groups", 1)),
    }
    prefix = str(spec.get("node_prefix", "node"))
    out: list[Node] = []
    for switch in spec.get("switch", []):
        _walk(switch, (), defaults, prefix, out)
    return tuple(out)


def _walk(
    switch: dict[str, Any],
    above: tuple[str, ...],
    defaults: dict[str, Any],
    prefix: str,
    out: list[Node],
) -> None:
    if "name" not in switch:
        raise ValueError(f"a switch under {'/'.join(above) or 'the root'} has no name")
    path = (*above, str(switch["name"]))
    here = {k: switch.get(k, v) for k, v in defaults.items()}
    for _ in range(int(switch.get("nodes", 0))):
        out.append(
            Node(
                name=f"{prefix}{len(out):04d}",
                gpus=gpus(int(here["gpus_per_node"]), here["gpu_model"], here["locality_groups"]),
                topology=path,
                block=switch.get("block"),
            )
        )
    for below in switch.get("switch", []):
        _walk(below, path, here, prefix, out)


def openb_cluster(path: str | Path, nodes_per_leaf: int = 32) -> tuple[Node, ...]:
    """Alibaba openb's GPU node list (sn, gpu, model), leaves of `nodes_per_leaf` in order."""
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    return tuple(
        Node(
            name=r["sn"],
            gpus=gpus(int(r["gpu"]), r["model"] or "sim"),
            topology=(f"leaf{i // nodes_per_leaf}",),
        )
        for i, r in enumerate(rows)
    )
