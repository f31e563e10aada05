"""Entry point of the job coordinator: `python -m services.launcher`."""

from __future__ import annotations

import os

from services.launcher.coordinator import Coordinator
from services.launcher.coordinator_core import CoordinatorConfig
from shared.runtime import serve_process
from shared.settings import LauncherSettings


def coordinator_config(settings: LauncherSettings) -> CoordinatorConfig:
    """The core's policy, from the process's settings."""
    return CoordinatorConfig(
        max_restarts=settings.restart_limit,
        kill_wait_s=settings.kill_wait_s,
        restart_grace_s=settings.fault_kill_wait_s,
        replace_with_spare=settings.replace_with_spare,
        failure_settle_s=settings.failure_settle_s,
        backoff_base_s=settings.restart_backoff_s,
        backoff_max_s=settings.restart_backoff_max_s,
    )


def main() -> None:
    settings = LauncherSettings.from_env(os.environ)
    config = coordinator_config(settings)
    serve_process(settings, lambda ctx: Coordinator(ctx, config, lease_s=settings.launcher_lease_s))


if __name__ == "__main__":
    main()
