"""Entry point: `python -m services.placer`."""

from __future__ import annotations

import asyncio
import os

from services.placer.service import Placer
from shared.runtime import run_service, service_context
from shared.settings import PlacerSettings


def main() -> None:
    settings = PlacerSettings.from_env(os.environ)

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings, stop) as ctx:
            await Placer(ctx).run(stop)

    run_service(settings, serve)


if __name__ == "__main__":
    main()
