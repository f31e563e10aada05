"""End to end: the services keep the outbox and the inbox trimmed while jobs run
(shared/retention.py). Every service process runs a pruner; here each is set to keep
no published event and to pass every half second, and jobs still run to their end with
every event delivered, while old inbox rows, published events and the placer's cycle
log go and the node faults stay."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import asyncpg
import pytest

from tests.support.cluster import eventually, job_state, nodes, running_cluster, submit

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
