"""End to end, on real NATS, PostgreSQL and processes: every process's /metrics, scraped
after a small workload with an injected XID, says what happened: jobs completed, the
XID counted with its class, the wait and fault-to-restart histograms filled, nodes and
GPUs by state. The values are read from the tables at scrape time (shared/metrics.py),
so what is asserted here is what an operator's Prometheus would see. The same run's
spans show one job's trace running admission -> placer -> launcher -> agent."""

from __future__ import annotations

import asyncio
import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import eventually, inject, job_state, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

NODES = nodes(3)
# Two partitions, one inside the other: a GPU of node03 counts in both.
CONFIG = """
[cluster]
name = "metrics-test"
default_partition = "normal"
default_qos = "normal"

[partitions.normal]
nodes = ["node[01-03]"]
default_time = "1:00:00"
max_time = "2:00:00"

[partitions.small]
nodes = ["node03"]
default_time = "10:00"
max_time = "1:00:00"

[qos.normal]
min_runtime = "0"

[accounts.root]
shares = 1

[accounts.research]
parent = "root"
shares = 1

[users.root]
accounts = ["research"]

[roles]
operators = ["root", "admin"]
"""
# two srun steps each, one ending FAILED: the job itself COMPLETES (its script exits 0)
SHORT = (
    "#!/bin/bash\nexport MUSTER_KEY_DIR={keys}\n"
    "{py} -m muster.cli srun true\n{py} -m muster.cli srun false\nexit 0\n"
)
SLEEPER = "#!/bin/bash\nsleep 600\n"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> Samples:
    host, rest = url.removeprefix("http://").split(":", 1)
    port, path = rest.split("/", 1)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)
    try:
        writer.write(f"GET /{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        raw = (await asyncio.wait_for(reader.read(), 30)).decode()
    finally:
        writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200"), head
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def spans_in(log: Path) -> list[dict[str, Any]]:
    """The spans the console exporter wrote into a process's log (one JSON object each,
    from a line "{" to a line "}")."""
    text = log.read_text(errors="replace")
    return [json.loads(block) for block in re.findall(r"(?ms)^\{$.*?^\}$", text)]


async def run_of(db: asyncpg.Connection, job_id: int) -> tuple[str, list[str]]:
    row = await db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id)
    return ("", []) if row is None else (row["state"], list(row["nodes"]))


async def settled(url: str, ok: Callable[[Samples], bool], what: str) -> Samples:
    return await eventually(lambda: scrape(url), ok, timeout=60, what=what)


async def test_every_endpoint_reports_the_workload_and_the_injected_xid(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(CONFIG)
    state = tmp_path / "state"
    async with running_cluster(
        state,
        nats_url,
        database_url,
        db,
        list(NODES),
        env={
            "MUSTER_CLUSTER_CONFIG": str(config),
            "MUSTER_OTEL_EXPORTER": "console",  # spans as JSON in each process's log
        },
    ) as cluster:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM partition_policy"),
            lambda n: n == 2,
            30,
            "the placement policy",
        )
        short_script = SHORT.format(keys=state / "keys", py=sys.executable)
        short = [
            (await submit(nats_url, short_script, ("--gpus-per-node=1",), str(tmp_path))).job_ids[0]
            for _ in range(2)
        ]
        for done in short:
            await eventually(
                functools.partial(job_state, db, done), lambda s: s == "COMPLETED", 60, "completed"
            )
        reply = await submit(nats_url, SLEEPER, ("--gpus-per-node=4",), str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
        victim = (await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id))[0]

        await inject(nats_url, victim, 79, gpu=1)
        await eventually(
            lambda: run_of(db, job_id),
            lambda r: r[0] == "RUNNING" and victim not in r[1],
            60,
            "the job running again on another node",
        )

        endpoints = cluster.metrics_endpoints()
        assert set(endpoints) == {*cluster.specs}, "every process has an endpoint"
        for url in endpoints.values():  # each answers, and reads every source it has
            got = await scrape(url)
            assert all(v == 1.0 for (n, _), v in got.items() if n == "muster_metrics_source_up"), (
                got
            )

        admission = await settled(
            endpoints["admission"],
            lambda s: total(s, "muster_queue_wait_seconds_count") >= 3,
            "every start's wait counted",
        )
        assert total(admission, "muster_jobs_ended_total", state="COMPLETED") == 2
        assert total(admission, "muster_jobs_ended_total", partition="normal") == 2
        assert total(admission, "muster_jobs", state="RUNNING") == 1
        # Three jobs started: their first attempts are the waits (the restart is not one).
        assert total(admission, "muster_queue_wait_seconds_count") == 3
        assert total(admission, "muster_queue_wait_seconds_bucket", le="+Inf") == 3
        assert total(admission, "muster_queue_wait_seconds_bucket", le="86400.0") == 3

        health = await scrape(endpoints["health"])
        assert total(health, "muster_xids_total", xid="79", fault_class="node_reboot") == 1
        assert total(health, "muster_xids_total") == 1
        assert total(health, "muster_nodes", state="FAILED") == 1
        assert total(health, "muster_nodes", state="UP") == 2
        assert total(health, "muster_gpus", state="unhealthy") == 1
        assert total(health, "muster_gpus", state="allocated") == 4
        # The failed node's three healthy GPUs take no work: drained.
        assert total(health, "muster_gpus", state="drained") == 3
        assert total(health, "muster_gpus", state="idle") == 4
        assert total(health, "muster_gpus") == 12  # each GPU once, whatever its partitions
        assert total(health, "muster_partition_gpus", partition="normal") == 12
        assert total(health, "muster_partition_gpus", partition="small") == 4

        launcher = await scrape(endpoints["launcher"])
        assert total(launcher, "muster_fault_to_restart_seconds_count") == 1
        assert total(launcher, "muster_ownership_changes_total") >= 1
        assert total(launcher, "muster_job_steps_running") == 0
        assert total(launcher, "muster_job_steps_ended_total", state="COMPLETED") == 2
        assert total(launcher, "muster_job_steps_ended_total", state="FAILED") == 2
        assert total(launcher, "muster_job_steps_ended_total", state="CANCELLED") == 0

        placer = await scrape(endpoints["placer"])
        assert total(placer, "muster_leader_changes_total", role="placer") >= 1
        assert total(placer, "muster_scheduling_pass_seconds_count") >= 1
        assert total(placer, "muster_allocations_total") >= 3  # 3 jobs (a spare joins one)

        fairshare = await settled(
            endpoints["fairshare"],
            lambda s: total(s, "muster_fairshare_usage_gpu_seconds_total") > 0,
            "usage charged",
        )
        assert total(fairshare, "muster_fairshare_usage_share") == pytest.approx(1.0)

        agent = await scrape(endpoints[f"node-{NODES[0].name}"])
        assert total(agent, "muster_request_seconds_count") >= 1  # it answered the launcher

    # The processes have stopped (their logs are flushed): one job's spans are one trace,
    # from its submission through the placer and the launcher to the node agent.
    spans = {log.stem: spans_in(log) for log in (state / "logs").glob("*.log")}
    [allocated] = [
        s for s in spans["launcher"]
        if s["name"] == "consume job.allocated" and s["attributes"].get("muster.job_id") == short[0]
    ]  # fmt: skip
    trace_id = allocated["context"]["trace_id"]
    in_trace = {
        (process, s["name"]) for process, found in spans.items() for s in found
        if s["context"]["trace_id"] == trace_id
    }  # fmt: skip
    assert ("admission", "serve muster.api.submit") in in_trace
    assert ("placer", "consume job.submitted") in in_trace
    assert any(p.startswith("node-") and n.endswith(".start") for p, n in in_trace), in_trace
