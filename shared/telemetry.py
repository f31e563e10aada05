"""Plumbing: OpenTelemetry setup and the one adapter that carries W3C trace context in
NATS headers, so a job's trace spans admission -> placer -> launcher."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from shared.settings import Settings

log = logging.getLogger(__name__)


def setup_tracing(settings: Settings) -> TracerProvider:
    """Install a tracer provider; the exporter is chosen by `MUSTER_OTEL_EXPORTER`."""
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
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

        endpoint = settings.otel_endpoint or None
        return OTLPSpanExporter(endpoint=endpoint)
    return None


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
