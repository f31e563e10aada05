"""Plumbing: a process's Prometheus metrics, served at `/metrics` from its own loop.

`run_service` starts a `MetricsServer` in every service and node agent (setting
`metrics_port`: 0 an ephemeral port, -1 off). It writes the URL it bound to
`<state_dir>/metrics/<process>.url`, where `muster up` and the tests find it, and renders
two things at each scrape:

- the process's own instruments, in prometheus-client's default registry: the process
  and Python collectors, and histograms fed by finished spans (`shared/telemetry.py`:
  scheduling pass seconds, handling seconds per consumer), which are per-process timings;
- the service's database-derived families: `services/<service>/metrics.py` holds
  `SOURCES`, each an async `collect(conn)` run at scrape time in one read-only
  snapshot, so a counter that must survive a restart (jobs finished, XIDs seen,
  leader changes) is read from the tables, never from process memory.

We serve HTTP ourselves (a few lines of asyncio) instead of prometheus-client's
threaded server because the sources query PostgreSQL on the process's loop: a scrape
then sees the tables as they are, not a cache a background task refreshed some time
before. The sources use a one-connection pool of the metrics server's own, made at
the first scrape, so a scrape never waits behind the service's work for a connection
and a busy scrape never takes one from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import importlib.util
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import prometheus_client
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shared.bus import Bus
from shared.db import Conn, Pool, create_pool
from shared.logs import kv
from shared.settings import Settings

log = logging.getLogger(__name__)

SOURCE_TIMEOUT_S = 10.0  # a source slower than this is reported down for this scrape
REQUEST_TIMEOUT_S = 5.0  # a client that sends no request line in this time is dropped
METRICS_FOLDER = "metrics"


class Source(Protocol):
    """Metric families derived from the database, read at each scrape."""

    name: str

    async def collect(self, conn: Conn) -> list[Metric]: ...


class BusSource(Protocol):
    """Metric families read from JetStream (consumer and stream state) at each scrape."""

    name: str

    async def collect(self, js: JetStreamContext) -> list[Metric]: ...


def process_key(settings: Settings) -> str:
    """The process's name, as `cluster.json` keys it: `placer`, `placer-1`, `node-n01`."""
    node = getattr(settings, "node", "")
    if settings.service_name == "node" and node:
        return f"node-{node}"
    if settings.instance in ("", "0"):
        return settings.service_name
    return f"{settings.service_name}-{settings.instance}"


def endpoint_file(state_dir: str | Path, key: str) -> Path:
    return Path(state_dir) / METRICS_FOLDER / f"{key}.url"


def read_endpoints(state_dir: str | Path) -> dict[str, str]:
    """Every process's `/metrics` URL that its endpoint file in `state_dir` names."""
    folder = Path(state_dir) / METRICS_FOLDER
    if not folder.is_dir():
        return {}
    return {p.stem: p.read_text().strip() for p in sorted(folder.glob("*.url"))}


def sources_of(service_name: str) -> tuple[Sequence[Source], Sequence[BusSource]]:
    """The sources of a service: `services/<name>/metrics.py`'s `SOURCES` (database) and
    `BUS_SOURCES` (JetStream), or none (a node agent reads neither)."""
    module = f"services.{service_name}.metrics"
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return (), ()
    if found is None:
        return (), ()
    loaded = importlib.import_module(module)
    return tuple(loaded.SOURCES), tuple(getattr(loaded, "BUS_SOURCES", ()))


# --- pure helpers shared by the services' sources -------------------------------------


def cumulate(
    rows: Iterable[tuple[tuple[str, ...], int, int, float]], bounds: Sequence[float]
) -> dict[tuple[str, ...], tuple[list[int], float]]:
    """Histogram buckets from grouped rows: (labels, bucket, count, sum), where bucket is
    PostgreSQL's `width_bucket(value, bounds)` (0: below the first bound, i: from
    bounds[i-1] up to bounds[i]). Returns, per label set, the cumulative counts of the
    `le` buckets (every bound, then +Inf) and the sum of the values."""
    out: dict[tuple[str, ...], tuple[list[int], float]] = {}
    for labels, bucket, count, total in rows:
        counts, acc = out.get(labels, ([0] * (len(bounds) + 1), 0.0))
        # width_bucket's bucket i holds values below bounds[i]: under le=bounds[i].
        for i in range(min(bucket, len(bounds)), len(bounds) + 1):
            counts[i] += count
        out[labels] = (counts, acc + total)
    return out


def histogram(
    name: str,
    doc: str,
    labels: Sequence[str],
    bounds: Sequence[float],
    data: Mapping[tuple[str, ...], tuple[list[int], float]],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, (counts, total) in sorted(data.items()):
        buckets = [(_le(b), float(c)) for b, c in zip(bounds, counts, strict=False)]
        buckets.append(("+Inf", float(counts[-1])))
        family.add_metric(list(values), buckets, total)
    return family


def _le(bound: float) -> str:
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]  # as its `le`: 1.0
    return text


def gauge(
    name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[tuple[str, ...], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), float(value))
    return family


# --- the server --------------------------------------------------------------------


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


class MetricsServer:
    """Serves `/metrics` for one process; `start` binds, `close` stops."""

    def __init__(
        self,
        settings: Settings,
        sources: Sequence[Source] = (),
        bus_sources: Sequence[BusSource] = (),
        registry: CollectorRegistry = prometheus_client.REGISTRY,
    ) -> None:
        self.settings = settings
        self.sources = tuple(sources)
        self.bus_sources = tuple(bus_sources)
        self._bus: Bus | None = None
        self.registry = registry
        self.url = ""
        self._server: asyncio.Server | None = None
        self._pool: Pool | None = None
        self._pool_lock = asyncio.Lock()

    async def start(self) -> str:
        port = max(self.settings.metrics_port, 0)
        host = self.settings.metrics_host
        try:
            self._server = await asyncio.start_server(self._serve, host, port)
        except OSError as err:  # the port recorded for us is taken: serve on another
            log.warning("metrics port taken, using another", extra=kv(port=port, error=str(err)))
            self._server = await asyncio.start_server(self._serve, host, 0)
        bound = self._server.sockets[0].getsockname()[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.url = f"http://{shown}:{bound}/metrics"
        self._write_endpoint()
        log.info("serving metrics", extra=kv(url=self.url))
        return self.url

    def _write_endpoint(self) -> None:
        path = endpoint_file(self.settings.state_dir, process_key(self.settings))
        with contextlib.suppress(OSError):  # no state folder (a bare agent): not recorded
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(self.url + "\n")
            os.replace(tmp, path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2.0)
        if self._pool is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pool.close(), timeout=2.0)
        if self._bus is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._bus.close(), timeout=2.0)

    async def render(self) -> bytes:
        """The text exposition of everything this process reports."""
        families = await self._database_families() if self.sources or self.bus_sources else []
        text = prometheus_client.generate_latest(self.registry)
        if families:
            extra = CollectorRegistry(auto_describe=False)
            extra.register(_Families(families))
            text += prometheus_client.generate_latest(extra)
        return text

    async def _database_families(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "muster_metrics_source_up",
            "1 if the source's last scrape query worked",
            labels=["source"],
        )
        took = GaugeMetricFamily(
            "muster_metrics_source_seconds", "Time the source's queries took", labels=["source"]
        )
        out: list[Metric] = [up, took]
        jobs: list[tuple[str, Callable[[], Awaitable[list[Metric]]]]] = [
            *((s.name, functools.partial(self._collect_db, s)) for s in self.sources),
            *((s.name, functools.partial(self._collect_bus, s)) for s in self.bus_sources),
        ]
        for name, collect in jobs:
            started = time.perf_counter()
            try:
                out.extend(await asyncio.wait_for(collect(), SOURCE_TIMEOUT_S))
                up.add_metric([name], 1.0)
            except Exception as err:  # a scrape during an outage: say so, serve the rest
                log.warning("metrics source failed", extra=kv(source=name, error=repr(err)))
                up.add_metric([name], 0.0)
            took.add_metric([name], time.perf_counter() - started)
        return out

    async def _collect_bus(self, source: BusSource) -> list[Metric]:
        return await source.collect(await self._get_jetstream())

    async def _collect_db(self, source: Source) -> list[Metric]:
        pool = await self._get_pool()
        async with (
            pool.acquire() as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            return await source.collect(conn)

    async def _get_jetstream(self) -> JetStreamContext:
        async with self._pool_lock:
            if self._bus is None:  # the process's own identity, on a secured bus too
                self._bus = await Bus.connect(
                    self.settings.nats_url,
                    name=f"metrics-{process_key(self.settings)}",
                    creds=self.settings.nats_creds,
                    tls_ca=self.settings.nats_tls_ca,
                    inbox_prefix=self.settings.nats_inbox_prefix,
                )
            return self._bus.js

    async def _get_pool(self) -> Pool:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = await create_pool(self.settings, max_size=1)
            return self._pool

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].split()
            path = parts[1].split(b"?", 1)[0] if len(parts) >= 2 else b""
            if path == b"/metrics":
                status, body = b"200 OK", await self.render()
                kind = prometheus_client.CONTENT_TYPE_LATEST.encode()
            else:
                status, body, kind = b"404 Not Found", b"try /metrics\n", b"text/plain"
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: "
                + kind
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            pass  # a client that went away or never asked: nothing to answer
        finally:
            writer.close()


async def start_metrics(settings: Settings) -> MetricsServer | None:
    """The process's metrics server, started; None when `metrics_port` is -1 (off) or
    no port can be bound (logged: a process without metrics still does its work)."""
    if settings.metrics_port < 0:
        return None
    server = MetricsServer(settings, *sources_of(settings.service_name))
    try:
        await server.start()
    except OSError as err:
        log.error("cannot serve metrics", extra=kv(error=str(err)))
        return None
    return server


async def close_metrics(server: MetricsServer | None) -> None:
    if server is not None:
        await server.close()
