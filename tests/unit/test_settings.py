"""Settings per process: each process kind reads its own `MUSTER_*` variables through
`Settings.from_env` (a subclass adds its fields), and nothing else reads the environment."""

from __future__ import annotations

import pytest

from services.fairshare.__main__ import FairShareSettings
from services.launcher.__main__ import LauncherSettings, coordinator_config
from services.launcher.coordinator_core import CoordinatorConfig
from shared.settings import SettingsError


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


def test_a_process_settings_survive_the_trip_to_a_child_process() -> None:
    settings = LauncherSettings.from_env({"MUSTER_RESTART_BACKOFF_MAX_S": "9"}, node="n1")
    assert LauncherSettings.from_env(settings.to_env()) == settings


def test_fairshare_reads_its_config_path_from_its_settings() -> None:
    settings = FairShareSettings.from_env({"MUSTER_FAIRSHARE_CONFIG": "/etc/muster/fs.toml"})
    assert settings.fairshare_config == "/etc/muster/fs.toml"


def test_a_bad_value_names_the_variable_and_what_it_expected() -> None:
    with pytest.raises(SettingsError) as bad:
        LauncherSettings.from_env({"MUSTER_FAILURE_SETTLE_S": "soon"})
    assert str(bad.value) == "MUSTER_FAILURE_SETTLE_S='soon': expected a number"
