"""Entry point: `python -m services.gateway` — the REST API and the dashboard on
`MUSTER_HTTP_HOST:MUSTER_HTTP_PORT` (127.0.0.1:8780), acting as one user
(services/gateway/settings.py says which key)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Generator

import uvicorn

from services.gateway.app import Gateway, make_app
from services.gateway.settings import GatewaySettings, acting_user, key_path
from services.gateway.upstream import Upstream
from shared.identity_files import KeyFileError, load_signer
from shared.logs import kv
from shared.runtime import run_service, service_context

log = logging.getLogger(__name__)


class Server(uvicorn.Server):
    """uvicorn without its own signal handlers: `run_service` owns SIGTERM (it sets
    `stop`, and the server is told to exit)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(settings: GatewaySettings, stop: asyncio.Event) -> None:
    try:
        signer = load_signer(key_path(settings))
    except KeyFileError as err:
        raise SystemExit(f"gateway: no usable key: {err}") from err
    # The same bus and pool every service opens (its credentials on a secured bus).
    async with service_context(settings, stop, pool_size=2) as ctx:
        upstream = Upstream(ctx.bus.nc, signer, acting_user(settings))
        gw = Gateway(
            upstream, ctx.pool, cache_s=settings.cache_s, tail_bytes=settings.output_tail_bytes
        )
        config = uvicorn.Config(
            make_app(gw),
            host=settings.http_host,
            port=settings.http_port,
            log_level="warning",
            lifespan="off",
        )
        server = Server(config)

        async def stopper() -> None:
            await stop.wait()
            server.should_exit = True

        log.info(
            "serving",
            extra=kv(host=settings.http_host, port=settings.http_port, user=upstream.user),
        )
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(stopper())
            await server.serve()
            stop.set()


def main() -> None:
    settings = GatewaySettings.from_env(os.environ)
    run_service(settings, lambda stop: serve(settings, stop))


if __name__ == "__main__":
    main()
