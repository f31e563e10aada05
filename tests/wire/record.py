"""Tooling, not a test: record the payloads under tests/wire/ from a live run.

    .venv/bin/python -m tests.wire.record [--out tests/wire] [--dry-run]

Starts NATS and PostgreSQL, a local cluster of four simulated nodes (every service and
agent its own process, tests/support/cluster.py), listens on `muster.>` and plays a
short story that makes the events happen: a fixed-size gang job loses a node to an
XID 79 and gets a spare, is cancelled while the agent of one of its nodes is dead (the
agent comes back listing the worker, which the launcher stops), the faulted node reboots
and comes back, an elastic job shrinks, a running job's time limit is raised and it is
preempted and requeued, a node is drained and its agent lost. Every message that decodes
as an event is a candidate; for each tag the one with the fewest empty fields is
written, so nested types (`Grant`, `GpuSlot`, `RunningWorker`) carry real, non-empty
values. A tag the story does not reach keeps its file (the run says which); `KEEP` are
never overwritten: they are published in production only by a policy the local cluster
does not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
from nats.aio.msg import Msg

from muster.client import agent, call
from shared import embedded, events
from shared.api import (
    InjectFault,
    JobSelector,
    NodeAction,
    Ok,
    QueueReply,
    QueueRequest,
    StopWorkers,
    UpdateRequest,
)
from shared.db import migrate
from tests.support.cluster import (
    eventually,
    inject,
    job_state,
    kill9,
    nodes,
    publish_event,
    running_cluster,
    submit,
)
from tests.unit.test_wire import unfilled

WIRE = Path(__file__).resolve().parent
# Preemption needs a configured policy (tiers, QOS): its request is published here by
# hand to make the job.requeued that follows real; the recorded request stays as is.
KEEP = frozenset({"job.preempt_requested"})
# Timings roomy enough for a restarted agent to be back before its node is DOWN.
ENV = {
    "MUSTER_HEARTBEAT_TIMEOUT_S": "3",
    "MUSTER_FENCE_S": "6",
    "MUSTER_DOWN_AFTER_S": "8",
    "MUSTER_GROW_BACK": "true",
}
SLEEPER = '#!/bin/bash\necho "attempt=$MUSTER_ATTEMPT gen=$MUSTER_GENERATION"\nsleep 300\n'
GANG = ("--nodes=2", "--gpus-per-node=4")
TAGS = [typing.cast(str, k.__struct_config__.tag) for k in typing.get_args(events.AnyEvent)]


class Recorder:
    """The most filled message seen of each event tag."""

    def __init__(self) -> None:
        self.best: dict[str, tuple[int, bytes]] = {}

    async def on_message(self, msg: Msg) -> None:
        try:
            event = events.decode(msg.data)
        except Exception:  # an API request or reply on muster.>, not an event
            return
        tag = events.tag_of(event)
        gaps = len(unfilled(json.loads(msg.data)))
        if tag not in self.best or gaps < self.best[tag][0]:
            self.best[tag] = (gaps, msg.data)

    def seen(self, tag: str, filled: Callable[[dict[str, Any]], bool] = lambda _: True) -> bool:
        return tag in self.best and filled(json.loads(self.best[tag][1]))

    async def wait(self, *tags: str, timeout: float = 60.0) -> None:
        async def probe() -> list[str]:
            return [t for t in tags if t not in self.best]

        await eventually(probe, lambda missing: not missing, timeout, f"events {tags}")


async def story(url: str, db: asyncpg.Connection, rec: Recorder, work: Path, c: Any) -> None:
    """The run, in phases; a phase that fails is reported and the next one runs."""
    w = str(work)

    async def fixed_gang_gets_a_spare() -> None:
        reply = await submit(url, SLEEPER, (*GANG, "-w", "node01,node02"), workdir=w)
        job = reply.job_ids[0]
        await eventually(lambda: job_state(db, job), lambda s: s == "RUNNING", 60, "running")
        await rec.wait("job.started", "usage.ticked")
        # a real XID carries NVML's recovery action (2: the node must reboot)
        await agent(url, "node01", "inject", InjectFault(gpu=1, xid=79, recovery_action=2))
        await rec.wait("gpu.xid_observed", "node.fault", "job.spares_answered", "worker.exited")
        await eventually(lambda: restarts(db, job), lambda n: n >= 1, 60, "on a spare")
        phases["job"] = job

    async def job_cancelled_while_its_agent_is_away() -> None:
        # node02's agent dies under the job's worker; the job is cancelled meanwhile; the
        # agent comes back listing the worker, and the launcher stops it (node.cleaned).
        job = phases["job"]
        node = next(n for n in NODES if n.name == "node02")
        kill9(c, "node-node02")
        await call(url, "cancel", JobSelector(user="root", job_ids=(job,)), Ok)
        c.start_node(node, **ENV)

        async def listed() -> bool:
            return rec.seen("node.registered", lambda e: bool(e["running"]))

        async def stopped() -> bool:
            return rec.seen("node.cleaned", lambda e: bool(e["stopped"]))

        await eventually(listed, bool, 60, "a registration listing a running worker")
        await eventually(stopped, bool, 60, "a cleaning that stopped a worker")
        await rec.wait("job.cancel_requested", "job.finished")

    async def faulted_node_reboots() -> None:
        await agent(url, "node01", "reboot", StopWorkers(job_id=0))
        await rec.wait("node.recovered")

    async def elastic_job_shrinks() -> None:
        reply = await submit(url, SLEEPER, ("--nodes=2:3", "--gpus-per-node=4"), workdir=w)
        job = reply.job_ids[0]
        await eventually(lambda: job_state(db, job), lambda s: s == "RUNNING", 60, "running")
        gone = await db.fetchval("SELECT nodes[1] FROM job_runs WHERE job_id = $1", job)
        await inject(url, gone, 79)
        await rec.wait("job.reconfigured")
        await call(url, "cancel", JobSelector(user="root", job_ids=(job,)), Ok)
        await eventually(lambda: job_state(db, job), lambda s: s == "CANCELLED", 60, "ended")

    async def preempted_job_is_requeued() -> None:
        reply = await submit(url, SLEEPER, ("--gpus-per-node=4",), workdir=w)
        job = reply.job_ids[0]
        await eventually(lambda: job_state(db, job), lambda s: s == "RUNNING", 60, "running")
        await call(
            url, "update", UpdateRequest(user="root", job_refs=(str(job),), time_limit_s=7200), Ok
        )
        await rec.wait("job.limit_changed")
        await publish_event(
            url, events.JobPreemptRequested(job_id=job, for_job_id=0, grace_s=1, epoch=0)
        )
        await rec.wait("job.requeued")
        await call(url, "cancel", JobSelector(user="root", job_ids=(job,)), Ok)

    async def node_drained_then_lost() -> None:
        await call(url, "drain", NodeAction(user="root", node="node04", reason="riser"), Ok)
        await rec.wait("node.drain_requested")
        kill9(c, "node-node04")
        await rec.wait("node.down")

    phases: dict[str, int] = {}
    for phase in (
        fixed_gang_gets_a_spare,
        job_cancelled_while_its_agent_is_away,
        faulted_node_reboots,
        elastic_job_shrinks,
        preempted_job_is_requeued,
        node_drained_then_lost,
    ):
        started = time.monotonic()
        try:
            await phase()
            print(f"{phase.__name__}: done in {time.monotonic() - started:.1f} s")
        except Exception as err:
            print(f"{phase.__name__}: FAILED ({err!r}); going on", file=sys.stderr)


NODES = nodes(4)


async def admission_ready(url: str, timeout: float = 120.0) -> None:
    """Until admission answers (it may start after the nodes on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await call(url, "queue", QueueRequest(user="root"), QueueReply, timeout=5)
            return
        except (TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() > deadline:
                raise


async def restarts(db: asyncpg.Connection, job: int) -> int:
    return int(await db.fetchval("SELECT restart_count FROM job_runs WHERE job_id=$1", job) or 0)


@contextlib.contextmanager
def servers(folder: Path) -> Iterator[tuple[str, str]]:
    """A NATS server and a migrated PostgreSQL database of our own, stopped on the way out."""
    pg = embedded.start_postgres(folder / "pg", fast=True)
    try:
        nats_server = embedded.start_nats(folder)
        try:
            database_url = embedded.create_database(pg.url, "muster")
            yield nats_server.url, database_url
        finally:
            nats_server.stop()
    finally:
        pg.stop()


async def record(folder: Path) -> Recorder:
    rec = Recorder()
    with servers(folder) as (nats_url, database_url):
        db = await asyncpg.connect(database_url)
        try:
            await migrate(db)
            nc = await nats.connect(nats_url)
            sub = await nc.subscribe("muster.>", cb=rec.on_message)
            try:
                async with running_cluster(
                    folder / "state",
                    nats_url,
                    database_url,
                    db,
                    list(NODES),
                    env=ENV,
                ) as c:
                    await rec.wait("node.registered")
                    await admission_ready(nats_url)
                    await story(nats_url, db, rec, folder / "work", c)
            finally:
                await sub.unsubscribe()
                await nc.close()
        finally:
            await db.close()
    return rec


def write(rec: Recorder, out: Path, dry_run: bool) -> None:
    for tag in TAGS:
        if tag in KEEP or tag not in rec.best:
            print(f"{tag}: kept ({'by design' if tag in KEEP else 'not seen in the run'})")
            continue
        gaps = unfilled(json.loads(rec.best[tag][1]))
        print(f"{tag}: recorded" + (f", empty in the run: {gaps}" if gaps else ""))
        if not dry_run:
            (out / f"{tag}.json").write_bytes(rec.best[tag][1] + b"\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.wire.record", description=__doc__)
    p.add_argument("--out", type=Path, default=WIRE, help="where the payloads go")
    p.add_argument("--dry-run", action="store_true", help="report, write nothing")
    p.add_argument("--keep", action="store_true", help="keep the run's folder (its logs)")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="muster-wire-"))
    (folder / "work").mkdir()
    (folder / "work").chmod(0o777)
    try:
        rec = asyncio.run(record(folder))
    finally:
        if args.keep:
            print(f"the run's folder: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    write(rec, args.out, args.dry_run)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
