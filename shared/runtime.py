"""Plumbing: the service lifecycle.

`run_service` runs a service's `main(ctx, stop)` on uvloop; SIGTERM or SIGINT sets
`stop`, consumers finish the message in hand, the relay and the connections drain.
`ServiceContext` is the `async with` that owns a process's bus, pool and relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import uvloop

from shared.bus import Bus
from shared.db import Pool, Relay, create_pool, migrate
from shared.logs import kv, setup_logging
from shared.settings import Settings
from shared.telemetry import setup_tracing

log = logging.getLogger(__name__)


@dataclass
class ServiceContext:
    settings: Settings
    bus: Bus
    pool: Pool
    relay: Relay


@contextlib.asynccontextmanager
async def service_context(
    settings: Settings, *, pool_size: int = 5
) -> AsyncIterator[ServiceContext]:
    bus = await Bus.connect(
        settings.nats_url,
        name=f"{settings.service_name}-{settings.instance}",
        max_deliver=settings.max_deliver,
        ack_wait_s=settings.ack_wait_s,
    )
    try:
        await bus.ensure_streams()
        pool = await create_pool(settings.database_url, max_size=pool_size)
        try:
            async with pool.acquire() as conn:
                await migrate(conn)
            yield ServiceContext(settings, bus, pool, Relay(pool, bus))
        finally:
            await asyncio.wait_for(pool.close(), timeout=settings.drain_timeout_s)
    finally:
        await bus.close()


def run_service(settings: Settings, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run `main(stop)` until it returns; SIGTERM/SIGINT set `stop`."""
    setup_logging(settings.log_level, settings.service_name)
    provider = setup_tracing(settings)

    async def supervised() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info("starting", extra=kv(service=settings.service_name, instance=settings.instance))
        await main(stop)
        log.info("stopped", extra=kv(service=settings.service_name))

    try:
        uvloop.run(supervised())
    finally:
        provider.shutdown()


async def until_stopped(
    stop: asyncio.Event, *tasks: Callable[[asyncio.Event], Coroutine[Any, Any, None]]
) -> None:
    """Run background loops in one TaskGroup; each gets `stop` and must return once set."""
    async with asyncio.TaskGroup() as group:
        for task in tasks:
            group.create_task(task(stop))


async def every(
    period_s: float, stop: asyncio.Event, action: Callable[[], Awaitable[None]]
) -> None:
    """Call `action` every `period_s` until `stop`; a failing call is logged, not fatal."""
    while not stop.is_set():
        try:
            await action()
        except (TimeoutError, OSError, RuntimeError) as err:
            log.warning(
                "periodic action failed",
                extra=kv(action=getattr(action, "__name__", "?"), error=repr(err)),
            )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=period_s)
