"""Plumbing: the service lifecycle.

`run_service` runs a service's `main(stop)` on uvloop; SIGTERM or SIGINT sets `stop`,
consumers finish the message in hand, the relay and the connections drain.
`service_context` is the `async with` that owns a process's bus, pool, relay and pruner; it
waits for NATS and PostgreSQL with backoff instead of failing when they are not up yet.
`until_stopped` runs a service's loops (Temporal-worker style: run until `stop`, then a
graceful timeout, then cancel), restarting a loop that fails instead of ending the
process, so an outage of either server delays a service and never ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import uvloop

from shared.bus import Bus
from shared.bus_auth import relay_subjects
from shared.db import Pool, Relay, create_pool, migrate
from shared.logs import kv, setup_logging
from shared.metrics import close_metrics, start_metrics
from shared.retention import Pruner, Retention
from shared.settings import Settings
from shared.telemetry import setup_tracing
from shared.transient import Backoff, is_transient
from shared.waits import cancel_and_wait

log = logging.getLogger(__name__)

T = TypeVar("T")
S = TypeVar("S", bound=Settings, covariant=True)  # the process kind's settings
SettingsT = TypeVar("SettingsT", bound=Settings)
Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]

# A loop that ran this long before failing was healthy: its next restart comes quickly.
HEALTHY_RUN_S = 30.0


class StoppedBeforeReady(Exception):
    """`stop` was set while the process still waited for its servers."""


@dataclass(frozen=True)
class ServiceContext(Generic[S]):
    settings: S
    bus: Bus
    pool: Pool
    relay: Relay
    pruner: Pruner


async def until_ready(what: str, attempt: Callable[[], Awaitable[T]], stop: asyncio.Event) -> T:
    """`attempt()` until it succeeds, waiting out transient errors (a server not up yet,
    or restarting) with backoff; a non-transient error is raised at once. `stop` ends
    the wait at once, an attempt in flight included (a first NATS connect to a server
    that is down takes up to `FIRST_CONNECT_S`)."""
    backoff = Backoff()
    while not stop.is_set():
        try:
            return await _unless_stopped(what, attempt(), stop)
        except StoppedBeforeReady:
            raise
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("waiting for a server", extra=kv(step=what, error=repr(err)))
            await backoff.wait(stop)
    raise StoppedBeforeReady(what)


async def _unless_stopped(what: str, attempt: Awaitable[T], stop: asyncio.Event) -> T:
    """`attempt`'s result, or StoppedBeforeReady once `stop` is set first (the attempt
    then cancelled and waited for, so nothing of it runs on). What it returned even
    so, its caller owns and closes."""
    task = asyncio.ensure_future(attempt)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        await cancel_and_wait(task)  # shared/waits.py: a lost cancel is sent again
    if task.cancelled():
        raise StoppedBeforeReady(what)
    return task.result()


@contextlib.asynccontextmanager
async def service_context(
    settings: SettingsT, stop: asyncio.Event | None = None, *, pool_size: int = 5
) -> AsyncIterator[ServiceContext[SettingsT]]:
    stop = stop or asyncio.Event()
    bus = await until_ready(
        "connect to NATS",
        lambda: Bus.connect(
            settings.nats_url,
            name=f"{settings.service_name}-{settings.instance}",
            max_deliver=settings.max_deliver,
            ack_wait_s=settings.ack_wait_s,
            stream_replicas=settings.stream_replicas,
            creds=settings.nats_creds,
            tls_ca=settings.nats_tls_ca,
            inbox_prefix=settings.nats_inbox_prefix,
        ),
        stop,
    )
    try:
        await until_ready("create streams", bus.ensure_streams, stop)
        pool = await until_ready(
            "connect to PostgreSQL", lambda: create_pool(settings, max_size=pool_size), stop
        )
        try:
            await until_ready("migrate", lambda: _migrate(pool), stop)
            # On a secured bus a service may publish only its own events: its relay
            # leaves the other services' outbox rows to theirs.
            owned = relay_subjects(settings.service_name) if settings.nats_creds else None
            relay = Relay(pool, bus, subjects=owned)
            yield ServiceContext(settings, bus, pool, relay, Pruner(pool, retention(settings)))
        finally:
            await _close_pool(pool, settings.drain_timeout_s)
    finally:
        await bus.close()


def retention(settings: Settings) -> Retention:
    return Retention(
        outbox_keep_s=settings.outbox_keep_s,
        inbox_keep_s=settings.inbox_keep_s,
        every_s=settings.prune_every_s,
    )


async def _close_pool(pool: Pool, timeout_s: float) -> None:
    """Close gracefully; a pool that cannot (PostgreSQL away, a query stuck) is
    terminated, so a stop during an outage still ends the process cleanly."""
    try:
        await asyncio.wait_for(pool.close(), timeout=timeout_s)
    except TimeoutError:
        log.warning("pool did not close in time, terminating its connections")
        pool.terminate()


async def _migrate(pool: Pool) -> None:
    async with pool.acquire() as conn:
        await migrate(conn)


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
        metrics = await start_metrics(settings)  # /metrics of this process (shared/metrics.py)
        # What is imported and set up by now lives as long as the process: kept out of
        # the collector's sight, a full collection takes under a millisecond instead of
        # 14-28 ms (measured in every service process, on a 2-core VM), a stall of
        # whatever the loop was serving, a start on its way included.
        gc.freeze()
        try:
            await main(stop)
        except StoppedBeforeReady as err:
            log.info("stopped before ready", extra=kv(step=str(err)))
        await close_metrics(metrics)
        log.info("stopped", extra=kv(service=settings.service_name))

    try:
        uvloop.run(supervised())
    finally:
        provider.shutdown()


class Service(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def serve_process(
    settings: SettingsT,
    make: Callable[[ServiceContext[SettingsT]], Service],
    *,
    pool_size: int = 5,
) -> None:
    """A service process's whole life, for a `__main__`: its bus, pool and relay
    (`service_context`), `make(ctx).run(stop)`, until SIGTERM or SIGINT."""

    async def serve(stop: asyncio.Event) -> None:
        async with service_context(settings, stop, pool_size=pool_size) as ctx:
            await make(ctx).run(stop)

    run_service(settings, serve)


async def until_stopped(stop: asyncio.Event, *loops: Loop, grace_s: float = 10.0) -> None:
    """Run a service's background loops until `stop`; each gets `stop` and must return
    once it is set. A loop that raises is logged and restarted with backoff, so one
    failure never ends the others. After `stop`, loops have `grace_s` to finish the
    work in hand; those still running then are cancelled."""
    async with asyncio.TaskGroup() as group:
        running = [group.create_task(_supervised(loop, stop)) for loop in loops]
        group.create_task(_cancel_after_grace(stop, running, grace_s))


async def _supervised(loop: Loop, stop: asyncio.Event) -> None:
    name = getattr(loop, "__qualname__", repr(loop))
    backoff = Backoff()
    while not stop.is_set():
        started = time.monotonic()
        try:
            await loop(stop)
            return
        except Exception as err:
            if time.monotonic() - started > HEALTHY_RUN_S:
                backoff.reset()
            if is_transient(err):
                log.warning("loop lost a server, restarting", extra=kv(loop=name, error=repr(err)))
            else:
                log.exception("loop failed, restarting", extra=kv(loop=name))
        await backoff.wait(stop)


async def _cancel_after_grace(
    stop: asyncio.Event, running: list[asyncio.Task[None]], grace_s: float
) -> None:
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stopped.done() and not all(task.done() for task in running):
            await asyncio.wait([stopped, *running], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not stop.is_set():
        return
    _, late = await asyncio.wait(running, timeout=grace_s)
    for task in late:
        log.warning("loop did not stop in time, cancelling", extra=kv(task=task.get_name()))
        task.cancel()


async def every(
    period_s: float, stop: asyncio.Event, action: Callable[[], Awaitable[None]]
) -> None:
    """Call `action` every `period_s` until `stop`; a failing call is logged, not fatal:
    the next period tries again (the actions are level-triggered reconciles)."""
    while not stop.is_set():
        try:
            await action()
        except Exception as err:
            name = getattr(action, "__name__", "?")
            if is_transient(err):
                log.warning("periodic action failed", extra=kv(action=name, error=repr(err)))
            else:
                log.exception("periodic action failed", extra=kv(action=name))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=period_s)


class TaskSet:
    """An owned set of background tasks: each is referenced until it ends (asyncio keeps
    only weak references) and `close` awaits the rest with a timeout, then cancels."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, timeout_s: float) -> None:
        if not self._tasks:
            return
        _, late = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            log.warning("tasks did not finish in time, cancelled", extra=kv(count=len(late)))
            await asyncio.wait(late, timeout=1.0)
