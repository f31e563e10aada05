"""Pure: the cluster's nodes as admission checks a job against them — GPUs, model,
features and the partitions each node serves (`shape` fills those in from the config).

Apart from `validate`, so that `fit` (the size checks `validate` calls) reads the same
types without importing `validate` back.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from .config_model import ClusterConfig


class NodeShape(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    gpus: int
    gpu_model: str | None = None  # the NVML name
    gpu_type: str | None = None  # the short name set in the config; None: from the model
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    cpus: int = 0  # as its agent announced them; 0: not known
    memory_mib: int = 0


class ClusterShape(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeShape, ...]

    def in_partition(self, name: str) -> tuple[NodeShape, ...]:
        return tuple(n for n in self.nodes if name in n.partitions)


def shape(config: ClusterConfig, nodes: Iterable[NodeShape]) -> ClusterShape:
    """Nodes with their partitions filled in from the configuration, and the features
    and GPU type its node sets give them (added to what the node itself announced)."""
    out = []
    for node in nodes:
        parts = tuple(
            name
            for name, part in config.partitions.items()
            if part.node_names is None or node.name in part.node_names
        )
        traits = config.node_traits.get(node.name)
        features = node.features if traits is None else (*node.features, *traits.features)
        out.append(
            msgspec.structs.replace(
                node,
                partitions=parts,
                features=tuple(dict.fromkeys(features)),
                gpu_type=(traits.gpu_type if traits else None) or node.gpu_type,
            )
        )
    return ClusterShape(nodes=tuple(out))
