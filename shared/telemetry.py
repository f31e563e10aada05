"""Plumbing: OpenTelemetry setup and the one adapter that carries W3C trace context in
NATS headers, so a job's trace spans admission -> placer -> launcher -> agent.

`MUSTER_OTEL_EXPORTER` chooses the exporter (none, console, otlp) and
`MUSTER_OTEL_ENDPOINT` where OTLP/HTTP goes (`http://jaeger:4318`: `/v1/traces` is added
when no path is given; empty: the exporter's own default and `OTEL_EXPORTER_OTLP_*`).
Whatever the exporter, finished spans also feed this process's Prometheus histograms
(`SpanMetrics`): the placer's pass, each consumer's handling, each request served."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from urllib.parse import urlsplit

from opentelemetry import context as context_api
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import SpanKind
from prometheus_client import Histogram

from shared.settings import Settings

log = logging.getLogger(__name__)


def setup_tracing(settings: Settings) -> TracerProvider:
    """Install a tracer provider; the exporter is chosen by `MUSTER_OTEL_EXPORTER`."""
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    provider.add_span_processor(SpanMetrics())
    exporter = _exporter(settings)
    if exporter is not None:
        if settings.otel_exporter == "console":
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def _exporter(settings: Settings) -> SpanExporter | None:
    if settings.otel_exporter == "console":
        return ConsoleSpanExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=otlp_traces_url(settings.otel_endpoint))
    return None


def otlp_traces_url(endpoint: str) -> str | None:
    """The OTLP/HTTP traces URL of `MUSTER_OTEL_ENDPOINT`: a bare collector address gets
    the standard `/v1/traces` path (the exporter would post to the bare address)."""
    if not endpoint:
        return None
    if urlsplit(endpoint).path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


# Per-process timings, as Prometheus histograms fed by finished spans (the span is the
# one place each pass or message is already timed). Module level: one per process.
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
EXAMINED_BUCKETS = (0, 1, 10, 100, 1000, 10_000, 100_000)
PASS_SECONDS = Histogram(
    "muster_scheduling_pass_seconds", "Duration of one placer scheduling pass", buckets=PASS_BUCKETS
)
PASS_EXAMINED = Histogram(
    "muster_scheduling_pass_jobs_examined",
    "Pending jobs one scheduling pass examined",
    buckets=EXAMINED_BUCKETS,
)
HANDLE_SECONDS = Histogram(
    "muster_bus_handle_seconds",
    "Time a consumer took to handle one event (retries of a transient error included)",
    ["consumer", "event"],
    buckets=PASS_BUCKETS,
)
REQUEST_SECONDS = Histogram(
    "muster_request_seconds",
    "Time to answer one request (muster.api.<verb>, muster.agent.<node>.<verb>)",
    ["verb"],
    buckets=PASS_BUCKETS,
)


class SpanMetrics(SpanProcessor):
    """Observes the histograms above as spans end: a placer cycle, a CONSUMER span (one
    per message), a SERVER span (one per request)."""

    def on_end(self, span: ReadableSpan) -> None:
        if span.start_time is None or span.end_time is None:
            return
        seconds = (span.end_time - span.start_time) / 1e9
        attributes = span.attributes or {}
        if span.name == "placer.cycle":
            PASS_SECONDS.observe(seconds)
            PASS_EXAMINED.observe(float(str(attributes.get("placer.pending", 0))))
        elif span.kind == SpanKind.CONSUMER:
            consumer = str(attributes.get("messaging.consumer", ""))
            HANDLE_SECONDS.labels(consumer, span.name.removeprefix("consume ")).observe(seconds)
        elif span.kind == SpanKind.SERVER:
            REQUEST_SECONDS.labels(span.name.rsplit(".", 1)[-1]).observe(seconds)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Add `traceparent`/`tracestate` of the current span to outgoing headers."""
    carrier = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> Context:
    return propagate.extract(dict(headers or {}))


def current_headers() -> dict[str, str]:
    """Trace context of the current span, for storing beside an outbox row."""
    return inject_headers({})


# One job's trace: the placer places many jobs per cycle, so an allocation written under
# the cycle's span would start a trace of its own. Instead the placer remembers the
# context each job's `job.submitted` arrived in, and the events it then writes about the
# job carry that context (`event_headers`), so submission -> placement -> launch -> the
# agent is one trace. Best effort and bounded: a restarted placer, or a standby that
# heard the submission, falls back to the cycle's span.
JOB_TRACES_MAX = 50_000
_job_traces: dict[int, Context] = {}


def remember_job_trace(event: object) -> None:
    """Keep the current context as the trace of the job `event` names, if it names one."""
    job_id = getattr(event, "job_id", None)
    if not isinstance(job_id, int) or not trace.get_current_span().get_span_context().is_valid:
        return
    _job_traces.pop(job_id, None)
    _job_traces[job_id] = context_api.get_current()
    while len(_job_traces) > JOB_TRACES_MAX:
        del _job_traces[next(iter(_job_traces))]


def event_headers(event: object) -> dict[str, str]:
    """Trace headers for an outbox row of `event`: its job's remembered trace, if any,
    else the current span's."""
    job_id = getattr(event, "job_id", None)
    ctx = _job_traces.get(job_id) if isinstance(job_id, int) else None
    if ctx is None:
        return current_headers()
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return carrier
