"""Entry point of the cluster-side health monitor: `python -m services.health`."""

from __future__ import annotations

import asyncio
import os

from services.health.monitor import Monitor
from shared.runtime import run_service, service_context
from shared.settings import HealthSettings


def main() -> None:
    settings = HealthSettings.from_env(os.environ)

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings, stop) as ctx:
            await Monitor(ctx).run(stop)

    run_service(settings, serve)


if __name__ == "__main__":
    main()
