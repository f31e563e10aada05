"""Settings per process kind: each reads only its own `MUSTER_*` variables through
`from_env`, ignores the other kinds' (a parent hands every child one environment), and
survives the trip to a child process through `to_env`."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.launcher.__main__ import coordinator_config
from services.launcher.coordinator_core import CoordinatorConfig
from shared.settings import (
    AdmissionSettings,
    FairShareSettings,
    HealthSettings,
    LauncherSettings,
    NodeSettings,
    PlacerSettings,
    Settings,
    SettingsError,
    ToolSettings,
)

# One environment as `muster up` hands it to every child: each kind takes its share.
ENV = {
    "MUSTER_NATS_URL": "nats://a:4222,nats://b:4222",
    "MUSTER_INSTANCE": "2",
    "MUSTER_LEASE_TTL_S": "3",
    "MUSTER_CYCLE_INTERVAL_S": "0.5",
    "MUSTER_DOWN_AFTER_S": "4",
    "MUSTER_CLUSTER_CONFIG": "/etc/muster/cluster.toml",
    "MUSTER_FAIRSHARE_CONFIG": "/etc/muster/fs.toml",
    "MUSTER_GROW_BACK": "yes",
    "MUSTER_NODE": "n7",
    "MUSTER_FENCE_S": "3",
    "MUSTER_ALLOW_ROOT_JOBS": "true",
    "MUSTER_NOT_A_FIELD_OF_ANYONE": "x",
}
COMMON = {"nats_url": "nats://a:4222,nats://b:4222", "instance": "2"}

CASES: dict[str, tuple[type[Settings], dict[str, Any]]] = {
    "the placer takes its cycle and its lease, nothing of the nodes'": (
        PlacerSettings,
        {"service_name": "placer", "cycle_interval_s": 0.5, "lease_ttl_s": 3.0},
    ),
    "the health monitor takes its lease and silence timings": (
        HealthSettings,
        {"service_name": "health", "lease_ttl_s": 3.0, "down_after_s": 4.0},
    ),
    "admission takes the cluster configuration": (
        AdmissionSettings,
        {"service_name": "admission", "cluster_config": "/etc/muster/cluster.toml"},
    ),
    "fairshare takes the cluster configuration and its own knobs file": (
        FairShareSettings,
        {
            "service_name": "fairshare",
            "cluster_config": "/etc/muster/cluster.toml",
            "fairshare_config": "/etc/muster/fs.toml",
        },
    ),
    "the launcher takes its restart policy": (
        LauncherSettings,
        # the cluster configuration too: it verifies srun's signed requests (docs/steps.md)
        {
            "service_name": "launcher",
            "grow_back": True,
            "cluster_config": "/etc/muster/cluster.toml",
        },
    ),
    "a node agent takes its node, fence and root policy": (
        NodeSettings,
        # the cluster configuration too: its node sets name the fabric links to watch
        {
            "service_name": "node",
            "node": "n7",
            "fence_s": 3.0,
            "allow_root_jobs": True,
            "cluster_config": "/etc/muster/cluster.toml",
        },
    ),
    "the supervisor takes the common settings only": (
        ToolSettings,
        {"service_name": "supervisor"},
    ),
    "a tool with only the common settings takes the servers and identity": (Settings, {}),
}


@pytest.mark.parametrize(("kind", "want"), CASES.values(), ids=CASES.keys())
def test_each_process_kind_reads_only_its_own_fields(
    kind: type[Settings], want: dict[str, Any]
) -> None:
    got = kind.from_env(ENV)
    assert got == msgspec.structs.replace(kind(), **COMMON, **want)
    assert kind.from_env(got.to_env()) == got  # and the same again in a child process


OWN_FIELDS = {
    "cluster_config": {AdmissionSettings, FairShareSettings, LauncherSettings, NodeSettings},
    "lease_ttl_s": {PlacerSettings, HealthSettings},
    "cycle_interval_s": {PlacerSettings},
    "fence_s": {NodeSettings},
    "restart_limit": {LauncherSettings},
}


@pytest.mark.parametrize(("field", "owners"), OWN_FIELDS.items(), ids=OWN_FIELDS.keys())
def test_a_field_belongs_only_to_the_kinds_that_use_it(
    field: str, owners: set[type[Settings]]
) -> None:
    kinds = [k for k, _ in CASES.values()]
    assert {k for k in kinds if field in k.__struct_fields__} == owners


def test_the_launcher_reads_its_own_variables_into_the_coordinator_policy() -> None:
    env = {
        "MUSTER_FAILURE_SETTLE_S": "0.5",
        "MUSTER_RESTART_BACKOFF_S": "2",
        "MUSTER_RESTART_BACKOFF_MAX_S": "7",
        "MUSTER_RESTART_LIMIT": "4",
    }
    config = coordinator_config(LauncherSettings.from_env(env))
    assert config == CoordinatorConfig(
        max_restarts=4,
        backoff_base_s=2.0,
        backoff_max_s=7.0,
        kill_wait_s=30.0,
        restart_grace_s=2.0,
        replace_with_spare=True,
        failure_settle_s=0.5,
    )


def test_the_launcher_defaults_are_the_coordinator_policy_defaults() -> None:
    want = CoordinatorConfig()
    got = coordinator_config(LauncherSettings())
    assert msgspec.structs.replace(got, restart_grace_s=want.restart_grace_s) == want


def test_an_override_wins_over_the_environment() -> None:
    settings = NodeSettings.from_env({"MUSTER_NODE": "n1"}, node="n2")
    assert settings.node == "n2"


def test_a_bad_value_names_the_variable_and_what_it_expected() -> None:
    with pytest.raises(SettingsError) as bad:
        LauncherSettings.from_env({"MUSTER_FAILURE_SETTLE_S": "soon"})
    assert str(bad.value) == "MUSTER_FAILURE_SETTLE_S='soon': expected a number"
