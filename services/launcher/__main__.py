"""Entry point of the job coordinator: `python -m services.launcher`."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping

from services.launcher.coordinator import Coordinator
from services.launcher.coordinator_core import CoordinatorConfig
from shared.runtime import run_service, service_context
from shared.settings import Settings, SettingsError


def coordinator_config(settings: Settings, env: Mapping[str, str]) -> CoordinatorConfig:
    """The core's policy: the shared settings plus the launcher's own `MUSTER_*`
    variables (failure settle time, restart backoff)."""
    defaults = CoordinatorConfig()

    def number(name: str, default: float) -> float:
        raw = env.get(name)
        if raw is None:
            return default
        try:
            return float(raw)
        except ValueError as err:
            raise SettingsError(name, raw, "a number of seconds") from err

    return CoordinatorConfig(
        max_restarts=settings.restart_limit,
        kill_wait_s=settings.kill_wait_s,
        restart_grace_s=settings.fault_kill_wait_s,
        replace_with_spare=settings.replace_with_spare,
        failure_settle_s=number("MUSTER_FAILURE_SETTLE_S", defaults.failure_settle_s),
        backoff_base_s=number("MUSTER_RESTART_BACKOFF_S", defaults.backoff_base_s),
        backoff_max_s=number("MUSTER_RESTART_BACKOFF_MAX_S", defaults.backoff_max_s),
    )


def main() -> None:
    settings = Settings.from_env(os.environ, service_name="launcher")
    config = coordinator_config(settings, os.environ)

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings, stop) as ctx:
            await Coordinator(ctx, config).run(stop)

    run_service(settings, serve)


if __name__ == "__main__":
    main()
