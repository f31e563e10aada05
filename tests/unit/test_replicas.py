"""Table tests: how many processes of each service `muster up --replicas` plans, and
which servers a NATS URL setting names."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from muster.cluster import SERVICES, Cluster, replicas_of
from shared.urls import nats_servers

REPLICAS: dict[str, tuple[int | Mapping[str, int], dict[str, int]]] = {
    "one of each by default": (1, dict.fromkeys(SERVICES, 1)),
    "two of every service, the launcher included (its replicas share jobs by shard)": (
        2,
        dict.fromkeys(SERVICES, 2),
    ),
    "a mapping names only the services it scales; the rest run one": (
        {"placer": 3},
        {"admission": 1, "placer": 3, "launcher": 1, "health": 1, "fairshare": 1},
    ),
    "a mapping may scale the launcher (a test of per-job ownership)": (
        {"launcher": 2},
        {"admission": 1, "placer": 1, "launcher": 2, "health": 1, "fairshare": 1},
    ),
    "zero or less still runs one": (0, dict.fromkeys(SERVICES, 1)),
}


@pytest.mark.parametrize(("asked", "want"), REPLICAS.values(), ids=REPLICAS.keys())
def test_replicas_of(asked: int | Mapping[str, int], want: dict[str, int]) -> None:
    assert {s: replicas_of(s, asked) for s in SERVICES} == want


def test_each_replica_is_its_own_process_with_its_instance(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, "nats://x", "postgresql://x")
    keys = cluster.plan_services({"placer": 2})
    assert keys == ["admission", "placer", "placer-1", "launcher", "health", "fairshare"]
    assert cluster.specs["placer-1"].env["MUSTER_INSTANCE"] == "1"
    ports = {k: s.env["MUSTER_METRICS_PORT"] for k, s in cluster.specs.items()}
    assert len(set(ports.values())) == len(keys), "each process its own /metrics port"
    assert cluster.metrics_endpoints()["placer-1"].endswith(f":{ports['placer-1']}/metrics")
    assert cluster.specs["placer-1"].module == "services.placer"


SERVERS = {
    "one server": ("nats://127.0.0.1:4222", ["nats://127.0.0.1:4222"]),
    "a cluster, comma-separated": (
        "nats://127.0.0.1:1,nats://127.0.0.1:2, nats://127.0.0.1:3",
        ["nats://127.0.0.1:1", "nats://127.0.0.1:2", "nats://127.0.0.1:3"],
    ),
    "stray commas are ignored": ("nats://a:1,,", ["nats://a:1"]),
}


@pytest.mark.parametrize(("url", "want"), SERVERS.values(), ids=SERVERS.keys())
def test_nats_servers(url: str, want: list[str]) -> None:
    assert nats_servers(url) == want
