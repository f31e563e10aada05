"""Entry point: `python -m services.fairshare`."""

from __future__ import annotations

import asyncio
import os

from services.fairshare.service import FairShare
from shared.runtime import run_service, service_context
from shared.settings import Settings


def main() -> None:
    settings = Settings.from_env(os.environ, service_name="fairshare")

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings) as ctx:
            await FairShare(ctx).run(stop)

    run_service(settings, serve)


if __name__ == "__main__":
    main()
