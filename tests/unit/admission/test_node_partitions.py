"""`nodes_reply`: each node lists the partitions that serve it, in the config's order,
and the reply names the default partition (sinfo marks it `*`) and each partition's
longest time limit (sinfo's TIMELIMIT)."""

from __future__ import annotations

from services.admission.config_model import ClusterConfig, Partition
from services.admission.config_reservations import ReservationConfig
from services.admission.node_partitions import nodes_reply
from shared.api import NodeView, PartitionView, ReservationView


def view(name: str) -> NodeView:
    return NodeView(
        name=name, state="UP", reason="", gpus_total=0, gpus_free=0, topology=(),
        last_heartbeat=None, last_fault=None,
    )  # fmt: skip


def part(name: str, nodes: tuple[str, ...] | None, most: int | None = None) -> Partition:
    return Partition(name=name, nodes=(), node_names=nodes, default_time_s=60, max_time_s=most)


def test_each_node_lists_the_partitions_that_serve_it() -> None:
    config = ClusterConfig(
        default_partition="gpu",
        default_qos="normal",
        partitions={
            "gpu": part("gpu", ("n1", "n2")),
            "debug": part("debug", None, 1800),
            "big": part("big", ("n2",)),
        },
        qos={},
    )
    reply = nodes_reply([view("n1"), view("n2"), view("n3")], config)
    assert [(n.name, n.partitions) for n in reply.nodes] == [
        ("n1", ("gpu", "debug")),
        ("n2", ("gpu", "debug", "big")),
        ("n3", ("debug",)),
    ]
    assert (reply.partitions, reply.default_partition) == (("gpu", "debug", "big"), "gpu")
    assert reply.time_limits == {"debug": 1800}  # sinfo's TIMELIMIT; the others: infinite


def test_without_a_config_every_node_serves_the_partition_jobs_get() -> None:
    reply = nodes_reply([view("n1")], None)
    assert [n.partitions for n in reply.nodes] == [("normal",)]
    assert (reply.partitions, reply.default_partition) == (("normal",), "normal")
    assert reply.partition_views == ()  # no limits to show


def test_each_partitions_limits_are_in_the_reply_in_the_configs_order() -> None:
    gpu = Partition(
        name="gpu", nodes=(), node_names=None, default_time_s=3600, max_time_s=86400,
        max_nodes=8, max_gpus_per_job=64, allowed_accounts=("ml",), allowed_qos=("normal",),
        default_qos="normal", priority_tier=2, requires_approval=True,
    )  # fmt: skip
    config = ClusterConfig(
        default_partition="gpu", default_qos="normal",
        partitions={"gpu": gpu, "debug": part("debug", None)}, qos={},
    )  # fmt: skip
    views = nodes_reply([view("n1")], config).partition_views
    assert [v.name for v in views] == ["gpu", "debug"]
    assert views[0] == PartitionView(
        name="gpu", default_time_s=3600, max_time_s=86400, max_nodes=8, max_gpus_per_job=64,
        allowed_accounts=("ml",), allowed_qos=("normal",), default_qos="normal",
        priority_tier=2, preempt_mode="requeue", requires_approval=True,
    )  # fmt: skip
    assert (views[1].max_time_s, views[1].max_nodes, views[1].allowed_accounts) == (None, None, ())


def test_each_reservation_is_shown_at_its_window_open_now_or_next() -> None:
    patch = ReservationConfig(
        name="patch", start=1_000.0, duration_s=3600, recurrence="weekly", maintenance=True
    )
    run = ReservationConfig(
        name="llm", start=50_000.0, duration_s=600, nodes=("n1",), accounts=("research",)
    )
    config = ClusterConfig(
        default_partition="gpu", default_qos="normal", partitions={"gpu": part("gpu", None)},
        qos={}, reservations={"patch": patch, "llm": run},
    )  # fmt: skip
    shown = nodes_reply([view("n1")], config, now=700_000.0).reservations
    assert shown == (
        ReservationView(
            name="llm", start=50_000.0, end=50_600.0, nodes=("n1",), accounts=("research",)
        ),
        ReservationView(
            name="patch", start=1_000.0 + 2 * 604_800, end=1_000.0 + 2 * 604_800 + 3600,
            recurrence="weekly", maintenance=True,
        ),
    )  # fmt: skip
