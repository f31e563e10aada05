"""The gateway's pure core: queue pages, the GPU map, utilisation buckets, refusal
statuses, and the file a job's output is in."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.core import (
    GpuCell,
    GpuState,
    Interval,
    Utilisation,
    gpu_map,
    http_status,
    output_file,
    page_from,
    page_of,
    utilisation,
    window,
)
from shared.api import GpuView, JobView, NodeView, QueueReply


def job(
    job_id: int, state: str = "PENDING", reason: str = "Priority", user: str = "alice"
) -> JobView:
    return JobView(
        job_id=job_id,
        name="train",
        user=user,
        account="ml",
        partition="gpu",
        qos="normal",
        state=state,
        reason=reason,
        nodes=1,
        gpus=4,
        nodelist=(),
        submitted_at=0.0,
        started_at=None,
        ended_at=None,
        time_limit_s=60,
        elapsed_s=0.0,
        exit_code=None,
        restart_count=0,
    )


def node(
    name: str,
    state: str = "UP",
    gpus: tuple[GpuView, ...] = (),
    fault: dict[str, Any] | None = None,
) -> NodeView:
    return NodeView(
        name=name,
        state=state,
        reason="",
        gpus_total=len(gpus),
        gpus_free=0,
        topology=(),
        last_heartbeat=None,
        last_fault=fault,
        gpus=gpus,
    )


def gpu(
    index: int, job: int | None = None, healthy: bool = True, xid: int | None = None
) -> GpuView:
    return GpuView(index=index, model="H100", healthy=healthy, allocated_to=job, last_xid=xid)


JOBS = tuple(job(i, "RUNNING" if i % 3 == 0 else "PENDING") for i in range(1, 11))

PAGES: dict[str, tuple[int, int, list[int], int]] = {
    "the first page": (1, 4, [1, 2, 3, 4], 3),
    "the last page is short": (3, 4, [9, 10], 3),
    "past the end: the last page": (9, 4, [9, 10], 3),
    "before the start: the first page": (0, 4, [1, 2, 3, 4], 3),
    "one page holds all": (1, 100, list(range(1, 11)), 1),
}


@pytest.mark.parametrize(("page", "per", "want_ids", "want_pages"), PAGES.values(), ids=PAGES)
def test_page_of(page: int, per: int, want_ids: list[int], want_pages: int) -> None:
    got = page_of(JOBS, page, per)
    assert [j.job_id for j in got.jobs] == want_ids
    assert got.pages == want_pages
    assert got.total == 10
    assert got.by_state == {"PENDING": 7, "RUNNING": 3}
    assert got.by_reason == {"Priority": 7}


def test_an_empty_queue_is_one_empty_page() -> None:
    got = page_of((), 5, 50)
    assert (got.jobs, got.page, got.pages, got.total) == ((), 1, 1, 0)


CELLS: dict[str, tuple[NodeView, tuple[GpuCell, ...]]] = {
    "a job's GPU shows the job, an idle one idle": (
        node("a", gpus=(gpu(0, job=7), gpu(1))),
        (
            GpuCell(index=0, state=GpuState.ALLOCATED, job=7, xid=None),
            GpuCell(index=1, state=GpuState.IDLE, job=None, xid=None),
        ),
    ),
    "an XID'd GPU is unhealthy and keeps its XID": (
        node("a", state="FAILED", gpus=(gpu(0, healthy=False, xid=79), gpu(1))),
        (
            GpuCell(index=0, state=GpuState.UNHEALTHY, job=None, xid=79),
            GpuCell(index=1, state=GpuState.DRAINED, job=None, xid=None),
        ),
    ),
    "a drained node's free GPUs are drained, its job's GPUs still show the job": (
        node("a", state="DRAINING", gpus=(gpu(0, job=3), gpu(1))),
        (
            GpuCell(index=0, state=GpuState.ALLOCATED, job=3, xid=None),
            GpuCell(index=1, state=GpuState.DRAINED, job=None, xid=None),
        ),
    ),
}


@pytest.mark.parametrize(("n", "want"), CELLS.values(), ids=CELLS)
def test_gpu_map_cells(n: NodeView, want: tuple[GpuCell, ...]) -> None:
    assert gpu_map((n,)).nodes[0].gpus == want


def test_gpu_map_counts_every_node_but_pages_them_by_name() -> None:
    nodes = (
        node("c", gpus=(gpu(0),)),
        node("a", state="FAILED", gpus=(gpu(0, healthy=False),), fault={"xid": 62}),
        node("b", gpus=(gpu(0, job=1),)),
    )
    got = gpu_map(nodes, page=1, per_page=2)
    assert [n.name for n in got.nodes] == ["a", "b"]
    assert got.nodes[0].xid == 62
    assert (got.total, got.pages) == (3, 2)
    assert got.by_state == {"allocated": 1, "idle": 1, "unhealthy": 1, "drained": 0}
    assert got.nodes_by_state == {"UP": 2, "FAILED": 1}


UTIL: dict[str, tuple[list[Interval], int, float, float, float, Utilisation]] = {
    "a job over the whole window keeps its GPUs busy": (
        [Interval(start=0.0, end=None, gpus=4)],
        8,
        100.0,
        300.0,
        100.0,
        Utilisation(start=100.0, bucket_s=100.0, total_gpus=8, busy=(4.0, 4.0), share=(0.5, 0.5)),
    ),
    "half a bucket counts half": (
        [Interval(start=150.0, end=250.0, gpus=2)],
        4,
        100.0,
        300.0,
        100.0,
        Utilisation(start=100.0, bucket_s=100.0, total_gpus=4, busy=(1.0, 1.0), share=(0.25, 0.25)),
    ),
    "an interval ended before the window counts nothing": (
        [Interval(start=0.0, end=50.0, gpus=8)],
        8,
        100.0,
        200.0,
        100.0,
        Utilisation(start=100.0, bucket_s=100.0, total_gpus=8, busy=(0.0,), share=(0.0,)),
    ),
    "the last bucket's mean is over its part that passed": (
        [Interval(start=200.0, end=None, gpus=4)],
        4,
        100.0,
        250.0,
        100.0,
        Utilisation(start=100.0, bucket_s=100.0, total_gpus=4, busy=(0.0, 4.0), share=(0.0, 1.0)),
    ),
    "no GPUs: shares are zero": (
        [],
        0,
        0.0,
        100.0,
        50.0,
        Utilisation(start=0.0, bucket_s=50.0, total_gpus=0, busy=(0.0, 0.0), share=(0.0, 0.0)),
    ),
}


@pytest.mark.parametrize(
    ("ivs", "total", "start", "now", "bucket", "want"), UTIL.values(), ids=UTIL
)
def test_utilisation(
    ivs: list[Interval], total: int, start: float, now: float, bucket: float, want: Utilisation
) -> None:
    assert utilisation(ivs, total, start, now, bucket) == want


STATUSES = {
    "someone else's job is forbidden": ("not_your_job", 403),
    "no such job": ("not_found", 404),
    "a bad option is the user's to fix": ("invalid", 400),
    "an unknown code too": ("something_new", 400),
    "the cluster away": ("unavailable", 503),
    "too many requests": ("rate_limited", 429),
}


@pytest.mark.parametrize(("code", "want"), STATUSES.values(), ids=STATUSES)
def test_http_status(code: str, want: int) -> None:
    assert http_status(code) == want


OUTPUTS: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "the default file, under the workdir": (
        {"user": "alice", "script": "x", "workdir": "/w"},
        "n1",
        "/w/slurm-5.out",
    ),
    "a pattern with the node": (
        {"user": "alice", "script": "x", "output": "/o/%x-%j-%N.log"},
        "n1",
        "/o/job-5-n1.log",
    ),
    "a redacted spec names no file": ({"redacted": True}, "n1", None),
}


@pytest.mark.parametrize(("spec", "on", "want"), OUTPUTS.values(), ids=OUTPUTS)
def test_output_file(spec: dict[str, Any], on: str, want: str | None) -> None:
    assert output_file(spec, job(5), on) == want


def test_window_pages_from_one_and_caps_the_page_size() -> None:
    assert [window(1, 100), window(3, 100), window(0, 100), window(2, 10_000)] == [
        (0, 100),
        (200, 100),
        (0, 100),
        (500, 500),
    ]


def test_a_page_cut_by_admission_keeps_its_counts_of_the_whole_selection() -> None:
    reply = QueueReply(jobs=JOBS[:4], total=10, by_state={"PENDING": 10}, by_reason={"X": 10})
    got = page_from(reply, 1, 4)
    assert (got.jobs, got.total, got.pages, got.by_state, got.by_reason) == (
        JOBS[:4],
        10,
        3,
        {"PENDING": 10},
        {"X": 10},
    )


def test_an_admission_that_sent_every_job_is_cut_here() -> None:
    got = page_from(QueueReply(jobs=JOBS), 2, 4)
    assert [j.job_id for j in got.jobs] == [5, 6, 7, 8] and got.total == 10
