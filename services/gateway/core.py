"""Pure core of the gateway: what the REST API and the dashboard show, computed from the
API's replies (and the read-only usage rows) — pages and summaries of the queue, the GPU
map, GPU utilisation buckets, the HTTP status of a refusal, the file a job's output is
in. No I/O, no clock: `now` is passed in."""

from __future__ import annotations

import math
import os
from collections import Counter
from enum import StrEnum
from typing import Any

import msgspec

from shared.api import JobView, NodeView, QueueReply
from shared.jobspec import JobSpec
from shared.outputs import output_paths
from shared.states import NodeState

MAX_PER_PAGE = 500


class GpuState(StrEnum):
    """One GPU on the map, in the order a reader looks for trouble."""

    ALLOCATED = "allocated"
    IDLE = "idle"
    UNHEALTHY = "unhealthy"
    DRAINED = "drained"  # its node is drained, draining or down: nothing new lands here


UNPLACEABLE_NODE_STATES = frozenset(NodeState) - {NodeState.UP}

# A refusal's `code` (shared.api.ApiError) -> the HTTP status the gateway answers with.
_STATUS = {
    "not_found": 404,
    "not_your_job": 403,
    "operator_only": 403,
    "forbidden": 403,
    "private": 403,
    "user_mismatch": 403,
    "unknown_user": 403,
    "unknown_key": 401,
    "unsigned": 401,
    "bad_signature": 401,
    "stale_request": 401,
    "replayed": 401,
    "malformed_credential": 401,
    "no_key": 401,
    "request_too_large": 413,
    "rate_limited": 429,
    "overloaded": 429,
    "unavailable": 503,
    "internal": 500,
}


def http_status(code: str) -> int:
    """The status of a refusal with `code`; anything else the user must change is a 400."""
    return _STATUS.get(code, 400)


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the queue and what the whole queue holds."""

    jobs: tuple[JobView, ...]
    total: int
    page: int
    per_page: int
    pages: int
    by_state: dict[str, int]
    by_reason: dict[str, int]  # pending jobs only


def page_of(jobs: tuple[JobView, ...], page: int, per_page: int) -> Page:
    """Page `page` (from 1; past the end: the last) of `jobs`, with counts of the whole."""
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    pages = max(1, math.ceil(len(jobs) / per_page))
    page = max(1, min(page, pages))
    start = (page - 1) * per_page
    return Page(
        jobs=jobs[start : start + per_page],
        total=len(jobs),
        page=page,
        per_page=per_page,
        pages=pages,
        by_state=dict(Counter(j.state for j in jobs)),
        by_reason=dict(Counter(j.reason for j in jobs if j.state == "PENDING" and j.reason)),
    )


def window(page: int, per_page: int) -> tuple[int, int]:
    """The (offset, limit) of page `page` (from 1) of `per_page` jobs."""
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    return (max(1, page) - 1) * per_page, per_page


def page_from(reply: QueueReply, page: int, per_page: int) -> Page:
    """The page `page` that admission cut (`QueueRequest.limit`), with its counts of the
    whole selection; an admission that sent the whole list (no `total`): cut here."""
    if reply.total == 0 and reply.jobs:
        return page_of(reply.jobs, page, per_page)
    per_page = max(1, min(per_page, MAX_PER_PAGE))
    return Page(
        jobs=reply.jobs,
        total=reply.total,
        page=max(1, page),
        per_page=per_page,
        pages=max(1, math.ceil(reply.total / per_page)),
        by_state=reply.by_state,
        by_reason=reply.by_reason,
    )


class GpuCell(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One GPU of the map, as a compact array: [index, state, job, xid]."""

    index: int
    state: GpuState
    job: int | None
    xid: int | None


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: str
    reason: str
    xid: int | None  # the node's last fault's XID, if it had one
    gpus: tuple[GpuCell, ...]


class GpuMap(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[NodeRow, ...]
    by_state: dict[str, int]  # GPUs per GpuState
    nodes_by_state: dict[str, int]
    total: int  # nodes matching before the page cut
    page: int
    pages: int


def gpu_state(node: NodeView, healthy: bool, job: int | None) -> GpuState:
    """A GPU with a job shows its job even on a failing node (the job is what moves);
    otherwise its health, then whether its node takes new work."""
    if job is not None:
        return GpuState.ALLOCATED
    if not healthy:
        return GpuState.UNHEALTHY
    if node.state in UNPLACEABLE_NODE_STATES:
        return GpuState.DRAINED
    return GpuState.IDLE


def _fault_xid(fault: dict[str, Any] | None) -> int | None:
    value = (fault or {}).get("xid")
    return value if isinstance(value, int) else None


def node_row(node: NodeView) -> NodeRow:
    cells = tuple(
        GpuCell(
            index=g.index,
            state=gpu_state(node, g.healthy, g.allocated_to),
            job=g.allocated_to,
            xid=g.last_xid,
        )
        for g in node.gpus
    )
    return NodeRow(
        name=node.name,
        state=node.state,
        reason=node.reason,
        xid=_fault_xid(node.last_fault),
        gpus=cells,
    )


def gpu_map(nodes: tuple[NodeView, ...], page: int = 1, per_page: int = 2000) -> GpuMap:
    """Every node's GPUs (a page of `per_page` nodes), with counts over all of them."""
    rows = tuple(node_row(n) for n in sorted(nodes, key=lambda n: n.name))
    per_page = max(1, per_page)
    pages = max(1, math.ceil(len(rows) / per_page))
    page = max(1, min(page, pages))
    gpus = Counter(c.state.value for r in rows for c in r.gpus)
    return GpuMap(
        nodes=rows[(page - 1) * per_page : page * per_page],
        by_state={s.value: gpus.get(s.value, 0) for s in GpuState},
        nodes_by_state=dict(Counter(r.state for r in rows)),
        total=len(rows),
        page=page,
        pages=pages,
    )


class Interval(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """GPUs held from `start` to `end` (None: still held); epoch seconds."""

    start: float
    end: float | None
    gpus: int


class Utilisation(msgspec.Struct, frozen=True, kw_only=True):
    start: float
    bucket_s: float
    total_gpus: int
    busy: tuple[float, ...]  # mean GPUs held per bucket
    share: tuple[float, ...]  # busy / total_gpus, 0..1


def utilisation(
    intervals: list[Interval], total_gpus: int, start: float, now: float, bucket_s: float
) -> Utilisation:
    """Mean GPUs held in each `bucket_s` bucket from `start` to `now` (the last bucket
    may be partial: its mean is over the part that has passed)."""
    count = max(1, math.ceil((now - start) / bucket_s))
    held = [0.0] * count
    for iv in intervals:
        lo, hi = max(iv.start, start), min(iv.end if iv.end is not None else now, now)
        if hi <= lo:
            continue
        first, last = int((lo - start) // bucket_s), min(count - 1, int((hi - start) // bucket_s))
        for b in range(first, last + 1):
            b_lo = start + b * bucket_s
            overlap = min(hi, b_lo + bucket_s) - max(lo, b_lo)
            if overlap > 0:
                held[b] += overlap * iv.gpus
    spans = [min(bucket_s, now - (start + b * bucket_s)) for b in range(count)]
    busy = tuple(round(h / s, 3) if s > 0 else 0.0 for h, s in zip(held, spans, strict=True))
    share = tuple(round(b / total_gpus, 4) if total_gpus else 0.0 for b in busy)
    return Utilisation(
        start=start, bucket_s=bucket_s, total_gpus=total_gpus, busy=busy, share=share
    )


def output_file(spec: dict[str, Any], job: JobView, node: str) -> str | None:
    """The stdout file of `job`'s worker on `node` (relative paths are under the job's
    workdir), or None when the spec shown is not the job's whole spec (another user's
    job, redacted by admission)."""
    try:
        parsed = msgspec.convert(spec, JobSpec)
    except (msgspec.ValidationError, TypeError):
        return None
    out, _ = output_paths(parsed, job.job_id, node)
    return out if os.path.isabs(out) else os.path.join(parsed.workdir, out)
