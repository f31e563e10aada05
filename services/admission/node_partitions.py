"""Pure: the partitions each node serves, for `muster nodes` and the `sinfo` shim; each
partition's limits and each reservation's next window, for `scontrol show partition`,
`scontrol show reservation` and `sinfo -T`.

A partition serves the nodes its config resolves to (`node_names`; None: every node).
Without a placement config every node serves every partition, and a job gets the
JobSpec's default partition, so that is the one partition shown.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from services.admission.config_model import ClusterConfig, Partition
from services.admission.config_reservations import ReservationConfig
from shared.api import NodesReply, NodeView, PartitionView, ReservationView
from shared.jobspec import JobSpec
from shared.windows import occurrence

# what a job without -p gets when no config says otherwise
NO_CONFIG_PARTITION: str = next(
    f.default for f in msgspec.structs.fields(JobSpec) if f.name == "partition"
)


def nodes_reply(
    views: Sequence[NodeView], config: ClusterConfig | None, now: float = 0.0
) -> NodesReply:
    """The nodes with their partitions, each partition's limits, and each reservation's
    occurrence open at `now` or next."""
    if config is None:
        names: tuple[str, ...] = (NO_CONFIG_PARTITION,)
        default = NO_CONFIG_PARTITION
        served = {v.name: names for v in views}
    else:
        names, default = tuple(config.partitions), config.default_partition
        served = {v.name: _served(v.name, config) for v in views}
    nodes = tuple(msgspec.structs.replace(v, partitions=served[v.name]) for v in views)
    limits = {
        name: p.max_time_s
        for name, p in (config.partitions.items() if config else ())
        if p.max_time_s is not None
    }
    views_of = tuple(partition_view(p) for p in (config.partitions.values() if config else ()))
    return NodesReply(
        nodes=nodes,
        partitions=names,
        default_partition=default,
        time_limits=limits,
        partition_views=views_of,
        reservations=tuple(
            reservation_view(r, now)
            for _, r in sorted(config.reservations.items() if config else ())
        ),
    )


def reservation_view(r: ReservationConfig, now: float) -> ReservationView:
    start, end = occurrence(r.start, r.duration_s, r.recurrence, now)
    return ReservationView(
        name=r.name,
        start=start,
        end=end,
        nodes=r.nodes,
        gpus=r.gpus,
        accounts=r.accounts,
        recurrence=r.recurrence,
        maintenance=r.maintenance,
    )


def partition_view(p: Partition) -> PartitionView:
    return PartitionView(
        name=p.name,
        default_time_s=p.default_time_s,
        max_time_s=p.max_time_s,
        max_nodes=p.max_nodes,
        max_gpus_per_job=p.max_gpus_per_job,
        allowed_accounts=p.allowed_accounts,
        allowed_qos=p.allowed_qos,
        default_qos=p.default_qos,
        priority_tier=p.priority_tier,
        preempt_mode=p.preempt_mode.value,
        requires_approval=p.requires_approval,
        def_mem_per_gpu_mib=p.def_mem_per_gpu_mib,
        def_mem_per_cpu_mib=p.def_mem_per_cpu_mib,
    )


def _served(node: str, config: ClusterConfig) -> tuple[str, ...]:
    return tuple(
        name
        for name, p in config.partitions.items()
        if p.node_names is None or node in p.node_names
    )
