"""End to end: the services keep the outbox and the inbox trimmed while jobs run
(shared/retention.py). Every service process runs a pruner; here each is set to keep
no published event and to pass every half second, and jobs still run to their end with
every event delivered, while old inbox rows, published events and the placer's cycle
log go and the node faults stay."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from shared.api import JobSelector, Ok
from tests.support.cluster import eventually, job_state, nodes, run_cli, running_cluster, submit
from tests.support.history import rows_of

pytestmark = pytest.mark.slow


async def outbox_left(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT subject, count(*) AS n FROM outbox WHERE published_at IS NOT NULL GROUP BY 1"
    )
    return {r["subject"]: r["n"] for r in rows}


async def test_a_cluster_trims_its_outbox_and_inbox_as_it_runs(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    await db.execute(
        "INSERT INTO inbox(consumer, event_id, applied_at)"
        " SELECT 'placer', gen_random_uuid(), now() - interval '9 days'"
        " FROM generate_series(1, 50)"
    )
    await db.execute(
        "INSERT INTO outbox(event_id, subject, payload, published_at)"
        " VALUES (gen_random_uuid(), 'muster.node.fault', convert_to('{}', 'UTF8'),"
        " now() - interval '90 days')"
    )
    env = {"MUSTER_PRUNE_EVERY_S": "0.5", "MUSTER_OUTBOX_KEEP_S": "0"}
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(2), env=env
    ) as c:
        ids: list[int] = []
        for _ in range(3):
            reply = await submit(c.nats_url, "#!/bin/bash\nsleep 0.2\n", ("--gpus-per-node=2",))
            ids += reply.job_ids
        for job_id in ids:
            await eventually(partial(job_state, db, job_id), lambda s: s == "COMPLETED")
        await eventually(
            lambda: outbox_left(db),
            lambda left: left == {"muster.node.fault": 1},
            what="every published event gone but the fault",
        )
        await eventually(
            lambda: db.fetchval(
                "SELECT count(*) FROM inbox WHERE applied_at < now() - interval '8 days'"
            ),
            lambda n: n == 0,
            what="the old inbox rows gone",
        )
        await eventually(  # the placer's own record of its cycles, kept as long
            lambda: db.fetchval("SELECT count(*) FROM placer_cycles"),
            lambda n: n == 0,
            what="the placer's cycle log trimmed",
        )
        # what was applied just now stays: a redelivery of it is still a no-op
        assert await db.fetchval("SELECT count(*) FROM inbox") > 0


async def test_a_cluster_purges_a_finished_job_with_every_row_once_past_its_keep(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """Real jobs (one ran a step, one ended before it ran) finish; those that ended over
    the kept year ago (their ends moved back here) go from every table by admission's
    pruner, and the hourly usage older than kept goes by the fairshare service's. A job
    that ended just now and one still waiting (held) stay, and asking for a purged job
    says it may have been purged."""
    env = {"MUSTER_PRUNE_EVERY_S": "0.5"}
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(2), env=env
    ) as c:
        stepped = (
            f"#!/bin/bash\nexport MUSTER_KEY_DIR={tmp_path / 'state' / 'keys'}"
            f" MUSTER_NATS_URL={c.nats_url}\n{sys.executable} -m muster.cli srun -N 2 true\n"
        )
        old = [
            (
                await submit(
                    c.nats_url, stepped, ("-N", "2", "--gpus-per-node=1", "--batch-nodes=first")
                )
            ).job_ids[0]
        ]
        old += (await submit(c.nats_url, "#!/bin/bash\ntrue\n")).job_ids
        recent = (await submit(c.nats_url, "#!/bin/bash\ntrue\n")).job_ids[0]
        held = (await submit(c.nats_url, "#!/bin/bash\ntrue\n", ("--hold",))).job_ids[0]
        unstarted = (await submit(c.nats_url, "#!/bin/bash\ntrue\n", ("--hold",))).job_ids[0]
        await call(c.nats_url, "cancel", JobSelector(user="root", job_ids=(unstarted,)), Ok)
        old.append(unstarted)
        for job_id in [*old[:2], recent]:
            await eventually(partial(job_state, db, job_id), lambda s: s == "COMPLETED")
        await eventually(partial(job_state, db, unstarted), lambda s: s == "CANCELLED")
        await eventually(  # every charge settled, as the fairshare service settles them
            lambda: db.fetchval("SELECT count(*) FROM usage_charges WHERE NOT settled"),
            lambda n: n == 0,
        )
        had = await rows_of(db, old)
        assert {"job_steps.job_id", "attempts.job_id", "allocation_gpus.alloc_id"} <= set(had)
        await db.execute(
            "INSERT INTO usage_hours(hour, account, user_name, gpu_seconds, billed)"
            " VALUES (now() - interval '3 years', 'ml', 'root', 1, 1)"
        )
        await db.execute(
            "UPDATE job_runs SET ended_at = ended_at - interval '400 days' WHERE job_id = ANY($1)",
            old,
        )
        await eventually(partial(rows_of, db, old), lambda left: left == {}, what="purged")
        await eventually(
            lambda: db.fetchval(
                "SELECT count(*) FROM usage_hours WHERE hour < now() - interval '1 year'"
            ),
            lambda n: n == 0,
            what="the old hourly usage trimmed",
        )
        assert (await rows_of(db, [recent]))["job_runs.job_id"] == 1
        assert (await rows_of(db, [held]))["waiting_jobs.job_id"] == 1  # still queued
        shown = run_cli("show", "job", str(old[0]), env={"MUSTER_NATS_URL": c.nats_url})
        assert shown.returncode != 0
        assert "finished more than 365 days ago and purged" in shown.stderr, shown.stderr
