"""Entry point: `python -m services.gateway` — the REST API and the dashboard on
`MUSTER_HTTP_HOST:MUSTER_HTTP_PORT` (127.0.0.1:8780), acting as one user
(services/gateway/settings.py says which key)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Generator

import uvicorn

from services.gateway.app import Gateway, make_app
from services.gateway.settings import GatewaySettings, acting_user, key_path
from services.gateway.upstream import Upstream
from shared.bus import Bus
from shared.bus_inbox import user_inbox
from shared.db import Pool, create_pool
from shared.identity_files import KeyFileError, load_signer
from shared.logs import kv
from shared.runtime import run_service, until_ready

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
    # A client of the API like the CLI (on a secured bus, as its user):
    # no streams to create, no migrations to run, only requests and read-only queries.
    bus = await until_ready("connect to NATS", lambda: connect_bus(settings), stop)
    try:
        pool = await until_ready(
            "connect to PostgreSQL", lambda: create_pool(settings, max_size=2), stop
        )
        try:
            await serve_http(settings, Upstream(bus.nc, signer, acting_user(settings)), pool, stop)
        finally:
            await pool.close()
    finally:
        await bus.close()


def connect_bus(settings: GatewaySettings) -> Awaitable[Bus]:
    return Bus.connect(
        settings.nats_url,
        name=f"gateway-{settings.instance}",
        # as the CLI connects: the acting user's key is their bus key, its inboxes theirs
        creds=settings.nats_creds or key_path(settings),
        tls_ca=settings.nats_tls_ca,
        inbox_prefix=settings.nats_inbox_prefix or user_inbox(acting_user(settings)),
    )


async def serve_http(
    settings: GatewaySettings, upstream: Upstream, pool: Pool, stop: asyncio.Event
) -> None:
    """Serve until `stop` (SIGTERM), or until uvicorn ends (it could not bind)."""
    gw = Gateway(upstream, pool, cache_s=settings.cache_s, tail_bytes=settings.output_tail_bytes)
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
