"""The pure parts of the metrics: histogram buckets from grouped rows, jobs counted by
the views' one state rule, shares of usage, process names, the OTLP URL; and the
/metrics server itself, over HTTP, with a source that cannot reach its database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from services.admission.metrics import JobsSource, count_jobs
from services.fairshare.metrics import shares
from services.health.metrics import gpu_counts, node_counts
from shared.metrics import (
    MetricsServer,
    cumulate,
    endpoint_file,
    histogram,
    process_key,
    read_endpoints,
)
from shared.settings import NodeSettings, PlacerSettings, Settings
from shared.states import JobState, NodeState
from shared.telemetry import otlp_traces_url

BOUNDS = (1.0, 10.0, 100.0)

CUMULATE = {
    "nothing grouped: no series": ([], {}),
    "below the first bound counts in every bucket": (
        [(("a",), 0, 2, 1.0)],
        {("a",): ([2, 2, 2, 2], 1.0)},
    ),
    "between bounds counts from its upper bound on": (
        [(("a",), 2, 3, 60.0)],
        {("a",): ([0, 0, 3, 3], 60.0)},
    ),
    "past the last bound counts in +Inf only": (
        [(("a",), 3, 1, 500.0)],
        {("a",): ([0, 0, 0, 1], 500.0)},
    ),
    "label sets are kept apart, their sums added": (
        [(("a",), 1, 1, 5.0), (("b",), 0, 1, 0.5), (("a",), 3, 1, 200.0)],
        {("a",): ([0, 1, 1, 2], 205.0), ("b",): ([1, 1, 1, 1], 0.5)},
    ),
}


@pytest.mark.parametrize(("rows", "want"), CUMULATE.values(), ids=CUMULATE.keys())
def test_cumulate(rows: list[Any], want: dict[Any, Any]) -> None:
    assert cumulate(rows, BOUNDS) == want


def test_a_histogram_renders_as_prometheus_histograms_do() -> None:
    """The family built from rows reads back like one prometheus-client observed."""
    ours = CollectorRegistry()
    data = cumulate([(("gpu",), 1, 1, 5.0), (("gpu",), 3, 1, 500.0)], BOUNDS)
    fam = histogram("muster_test_seconds", "x", ["partition"], BOUNDS, data)
    ours.register(_Static([fam]))
    theirs = CollectorRegistry()
    h = Histogram("muster_test_seconds", "x", ["partition"], buckets=BOUNDS, registry=theirs)
    h.labels("gpu").observe(5.0)
    h.labels("gpu").observe(500.0)
    assert _samples(ours) == _samples(theirs)


class _Static:
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[Any, ...]], float]:
    from prometheus_client import generate_latest

    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[s.name, tuple(sorted(s.labels.items()))] = s.value
    return out


def group(partition: str = "gpu", jobs: int = 1, **facts: Any) -> dict[str, Any]:
    row = {
        "partition": partition,
        "run_state": None,
        "cancelled": False,
        "allocated": False,
        "held": False,
        "held_by_operator": False,
        "needs_approval": False,
        "approved": False,
        "wait_reason": None,
        "jobs": jobs,
    }
    return row | facts


COUNT_JOBS = {
    "a job never placed is pending for its priority": (
        [group(jobs=3)],
        {("gpu", JobState.PENDING): 3},
        {("gpu", "PRIORITY"): 3},
    ),
    "the placer's reason is the pending reason": (
        [group(wait_reason="RESOURCES", jobs=2)],
        {("gpu", JobState.PENDING): 2},
        {("gpu", "RESOURCES"): 2},
    ),
    "a requeued run is pending again, for the queue's reason": (
        [group(run_state=JobState.REQUEUED, wait_reason="RESOURCES")],
        {("gpu", JobState.PENDING): 1},
        {("gpu", "RESOURCES"): 1},
    ),
    "allocated without a run is configuring": (
        [group(allocated=True)],
        {("gpu", JobState.CONFIGURING): 1},
        {},
    ),
    "an operator's hold says so": (
        [group(held=True, held_by_operator=True)],
        {("gpu", JobState.PENDING): 1},
        {("gpu", "HELD_ADMIN"): 1},
    ),
    "cancelled before it ran": (
        [group(cancelled=True)],
        {("gpu", JobState.CANCELLED): 1},
        {},
    ),
    "a final run state wins over a cancel asked later": (
        [group(run_state=JobState.COMPLETED, cancelled=True, jobs=4)],
        {("gpu", JobState.COMPLETED): 4},
        {},
    ),
    "partitions are counted apart": (
        [group("a", run_state=JobState.RUNNING), group("b", run_state=JobState.RUNNING)],
        {("a", JobState.RUNNING): 1, ("b", JobState.RUNNING): 1},
        {},
    ),
}


@pytest.mark.parametrize(
    ("groups", "want_states", "want_pending"), COUNT_JOBS.values(), ids=COUNT_JOBS.keys()
)
def test_count_jobs(
    groups: list[dict[str, Any]], want_states: dict[Any, int], want_pending: dict[Any, int]
) -> None:
    states, pending = count_jobs(groups)
    assert dict(states) == want_states
    assert dict(pending) == want_pending


SHARES = {
    "no usage: every share is 0": ([("a", 0.0), ("b", 0.0)], [(("a",), 0.0), (("b",), 0.0)]),
    "shares of the total": ([("a", 3.0), ("b", 1.0)], [(("a",), 0.75), (("b",), 0.25)]),
    "a negative rounding residue counts as none": (
        [("a", -1e-9), ("b", 2.0)],
        [(("a",), 0.0), (("b",), 1.0)],
    ),
}


@pytest.mark.parametrize(("decayed", "want"), SHARES.values(), ids=SHARES.keys())
def test_shares(decayed: list[tuple[str, float]], want: list[Any]) -> None:
    assert shares(decayed) == want


GPU_COUNTS = {
    "no placement policy: one partition of every node": (
        [("n1", "idle", 3), ("n1", "unhealthy", 1), ("n2", "allocated", 4)],
        [],
        {"idle": 3, "unhealthy": 1, "allocated": 4},
        {("", "idle"): 3, ("", "unhealthy"): 1, ("", "allocated"): 4},
    ),
    "a GPU in two partitions counts once overall and once in each": (
        [("n1", "idle", 4), ("n2", "allocated", 4)],
        [("all", None), ("small", ["n2"])],
        {"idle": 4, "allocated": 4},
        {("all", "idle"): 4, ("all", "allocated"): 4, ("small", "allocated"): 4},
    ),
    "a node in no partition counts only overall": (
        [("n1", "drained", 2)],
        [("small", ["n2"])],
        {"drained": 2},
        {},
    ),
}


@pytest.mark.parametrize(
    ("per_node", "partitions", "want_whole", "want_parts"),
    GPU_COUNTS.values(),
    ids=GPU_COUNTS.keys(),
)
def test_gpu_counts(
    per_node: list[tuple[str, str, int]],
    partitions: list[tuple[str, list[str] | None]],
    want_whole: dict[str, int],
    want_parts: dict[tuple[str, str], int],
) -> None:
    whole, parts = gpu_counts(per_node, partitions)
    assert (dict(whole), dict(parts)) == (want_whole, want_parts)


def test_every_node_state_has_a_series_even_at_zero() -> None:
    got = dict(node_counts([("UP", 3), ("DRAINED", 1)]))
    assert got == {(s.value,): {"UP": 3.0, "DRAINED": 1.0}.get(s.value, 0.0) for s in NodeState}


PROCESS_KEYS = {
    "a service's first replica is its name": (PlacerSettings(), "placer"),
    "another replica carries its instance": (PlacerSettings(instance="2"), "placer-2"),
    "a node agent is named by its node": (NodeSettings(node="n01"), "node-n01"),
}


@pytest.mark.parametrize(("settings", "want"), PROCESS_KEYS.values(), ids=PROCESS_KEYS.keys())
def test_process_key_is_the_cluster_json_key(settings: Settings, want: str) -> None:
    assert process_key(settings) == want


OTLP = {
    "unset: the exporter's default": ("", None),
    "a bare collector gets the traces path": ("http://jaeger:4318", "http://jaeger:4318/v1/traces"),
    "a trailing slash too": ("http://jaeger:4318/", "http://jaeger:4318/v1/traces"),
    "a full URL is kept": ("http://c:4318/custom", "http://c:4318/custom"),
}


@pytest.mark.parametrize(("endpoint", "want"), OTLP.values(), ids=OTLP.keys())
def test_otlp_traces_url(endpoint: str, want: str | None) -> None:
    assert otlp_traces_url(endpoint) == want


async def _get(url: str) -> tuple[str, str]:
    host, rest = url.removeprefix("http://").split(":", 1)
    port, path = rest.split("/", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await asyncio.wait_for(reader.read(), 30)).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return head.split("\r\n", 1)[0], body


async def test_the_server_serves_metrics_and_reports_a_source_it_cannot_read(
    tmp_path: Path,
) -> None:
    """A source whose database is unreachable is reported down; the rest is served, and
    the bound URL is written where `muster up` looks for it."""
    settings = PlacerSettings(
        state_dir=str(tmp_path),
        database_url="postgresql://nobody@127.0.0.1:1/none",
        db_connect_timeout_s=1.0,
    )
    server = MetricsServer(settings, [JobsSource()])
    url = await server.start()
    try:
        assert read_endpoints(tmp_path) == {"placer": url}
        assert endpoint_file(tmp_path, "placer").read_text().strip() == url
        status, body = await _get(url)
        assert status == "HTTP/1.1 200 OK"
        families = {f.name: f for f in text_string_to_metric_families(body)}
        up = {s.labels["source"]: s.value for s in families["muster_metrics_source_up"].samples}
        assert up == {"jobs": 0.0}
        assert "process_cpu_seconds" in families or "python_info" in families
        status, _ = await _get(url.replace("/metrics", "/nothing"))
        assert status == "HTTP/1.1 404 Not Found"
    finally:
        await server.close()


def test_events_about_a_job_carry_the_trace_its_submission_arrived_in() -> None:
    """What the placer writes about a job continues the job's trace, not the cycle's."""
    from opentelemetry.sdk.trace import TracerProvider

    from shared.telemetry import event_headers, remember_job_trace

    tracer = TracerProvider().get_tracer("test")

    class About:
        def __init__(self, job_id: int) -> None:
            self.job_id = job_id

    with tracer.start_as_current_span("consume job.submitted") as submitted:
        remember_job_trace(About(987_654))
    with tracer.start_as_current_span("placer.cycle") as cycle:
        ours = event_headers(About(987_654))
        other = event_headers(About(987_655))
    job_trace = f"{submitted.get_span_context().trace_id:032x}"
    cycle_trace = f"{cycle.get_span_context().trace_id:032x}"
    assert ours["traceparent"].split("-")[1] == job_trace
    assert other["traceparent"].split("-")[1] == cycle_trace != job_trace
