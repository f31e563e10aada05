"""Entry point: `python -m services.admission`."""

from __future__ import annotations

import asyncio
import os

from services.admission.service import Admission
from shared.runtime import run_service, service_context
from shared.settings import AdmissionSettings


def main() -> None:
    settings = AdmissionSettings.from_env(os.environ)

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings, stop, pool_size=10) as ctx:
            await Admission(ctx).run(stop)

    run_service(settings, serve)


if __name__ == "__main__":
    main()
