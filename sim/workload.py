"""Trace loaders: public GPU-cluster traces and a simple CSV, as a list of TraceJobs.

Formats (submit times are made relative: the first job arrives at 0):

- philly: petuum/adaptdl's philly.csv (timestamp, duration, num_gpus, gpu_time, cluster);
  the virtual cluster becomes the account and the user.
- kalos: AcmeTrace's kalos_converted.csv (arrival_time, num_iteration x 0.5 s runtime,
  gpu_workers).
- openb: Alibaba's openb_pod_list_*.csv (creation_time, scheduled_time, deletion_time,
  num_gpu, gpu_milli, qos). Only pods that were scheduled in production are replayed;
  a fractional GPU (gpu_milli < 1000) counts as one whole GPU; the QOS is the account.
- csv: a header line and `submit_time,duration_s,nodes,gpus_per_node,user,account` with an
  optional seventh column `time_limit_s`; times in seconds.

GPU counts become a shape: up to 8 GPUs on one node, a multiple of 8 as whole nodes of 8,
anything else as a GPU total the placer lays out.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import msgspec

FORMATS = ("philly", "kalos", "openb", "csv")


class TraceJob(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    submit_s: float
    duration_s: float
    nodes: int = 1
    gpus_per_node: int = 0
    gpus_total: int | None = None
    user: str = "user"
    account: str = "default"
    time_limit_s: int | None = None  # None: derived from the duration by the simulator
    tier: int = 0
    can_preempt: bool = False
    production_delay_s: float | None = None  # what the traced cluster recorded, if known

    @property
    def gpus(self) -> int:
        return self.gpus_total if self.gpus_total is not None else self.nodes * self.gpus_per_node


def shaped(gpus: int, per_node: int = 8) -> dict[str, int | None]:
    """A GPU count as a request shape (see the module docstring)."""
    if gpus <= per_node:
        return {"nodes": 1, "gpus_per_node": gpus, "gpus_total": None}
    if gpus % per_node == 0:
        return {"nodes": gpus // per_node, "gpus_per_node": per_node, "gpus_total": None}
    return {"nodes": math.ceil(gpus / per_node), "gpus_per_node": 0, "gpus_total": gpus}


def load(path: str | Path, fmt: str, limit: int | None = None) -> list[TraceJob]:
    """Jobs of a trace in submit order, the first `limit` of them if given."""
    readers = {"philly": _philly, "kalos": _kalos, "openb": _openb, "csv": _plain}
    if fmt not in readers:
        raise ValueError(f"unknown trace format {fmt!r}; use one of {', '.join(FORMATS)}")
    with Path(path).open(newline="") as f:
        rows = list(readers[fmt](csv.DictReader(f)))
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]
    t0 = rows[0][0] if rows else 0.0
    return [
        msgspec.structs.replace(job, job_id=i + 1, submit_s=submit - t0)
        for i, (submit, job) in enumerate(rows)
    ]


Row = tuple[float, TraceJob]


def _job(submit: float, duration: float, gpus: int, **kw: object) -> Row:
    job = TraceJob(job_id=0, submit_s=submit, duration_s=max(duration, 1.0), **shaped(gpus), **kw)  # type: ignore[arg-type]
    return submit, job


def _philly(rows: csv.DictReader[str]) -> Iterator[Row]:
    for r in rows:
        submit = datetime.fromisoformat(r["timestamp"]).timestamp()
        vc = f"vc-{r['cluster']}"
        yield _job(submit, float(r["duration"]), int(r["num_gpus"]), user=vc, account=vc)


def _kalos(rows: csv.DictReader[str]) -> Iterator[Row]:
    for r in rows:
        runtime = float(r["num_iteration"]) * 0.5
        yield _job(float(r["arrival_time"]), runtime, int(r["gpu_workers"]), account="kalos")


def _openb(rows: csv.DictReader[str]) -> Iterator[Row]:
    for r in rows:
        if not r["scheduled_time"] or not r["deletion_time"]:
            continue
        created, scheduled = float(r["creation_time"]), float(r["scheduled_time"])
        duration = float(r["deletion_time"]) - scheduled
        qos = r["qos"] or "default"
        yield _job(
            created,
            duration,
            int(r["num_gpu"]),
            user=qos,
            account=qos,
            production_delay_s=scheduled - created,
        )


def _plain(rows: csv.DictReader[str]) -> Iterator[Row]:
    for r in rows:
        nodes, per_node = int(r["nodes"]), int(r["gpus_per_node"])
        limit = r.get("time_limit_s")
        job = TraceJob(
            job_id=0,
            submit_s=float(r["submit_time"]),
            duration_s=max(float(r["duration_s"]), 1.0),
            nodes=nodes,
            gpus_per_node=per_node,
            user=r["user"],
            account=r["account"],
            time_limit_s=int(float(limit)) if limit else None,
        )
        yield job.submit_s, job
