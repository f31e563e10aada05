"""Admission replicas share one replay ledger (real PostgreSQL and NATS): a signed
request replayed to any replica is refused and stores nothing, whichever replica got
the original; the ledger itself records each nonce once, across replicas and batches."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

import asyncpg
import msgspec
import nats

from muster.client import call
from services.admission.nonces import NonceLedger
from services.admission.service import Admission
from shared.api import API_PREFIX, Envelope, QueueReply, QueueRequest, SubmitRequest
from shared.db import create_pool
from shared.identity_files import load_signer
from shared.runtime import service_context
from shared.settings import AdmissionSettings, Settings
from tests.support.cluster import identity_settings

SCRIPT = "#!/bin/bash\ntrue\n"


async def test_a_request_replayed_to_every_replica_is_refused_and_stores_one_job(
    nats_url: str, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    identity = identity_settings(tmp_path)
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        contexts = [
            await stack.enter_async_context(
                service_context(
                    AdmissionSettings(
                        nats_url=nats_url,
                        database_url=database_url,
                        service_name="admission",
                        instance=str(i),
                        **identity,
                    )
                )
            )
            for i in range(2)  # two replicas in one queue group
        ]
        tasks = [asyncio.create_task(Admission(c).run(stop)) for c in contexts]
        await call(nats_url, "queue", QueueRequest(user="root"), QueueReply)
        await asyncio.sleep(0.5)  # both replicas subscribed
        alice = load_signer(identity["user_keys_dir"] + "/alice.nk")
        body = msgspec.json.encode(SubmitRequest(script=SCRIPT, script_path="job.sh"))
        wire = alice.sign(API_PREFIX + "submit", body, now=time.time(), nonce=os.urandom(16))
        nc = await nats.connect(nats_url)
        try:
            replies = [
                msgspec.json.decode(
                    (await nc.request(API_PREFIX + "submit", wire, 10)).data, type=Envelope
                )
                for _ in range(20)  # the queue group spreads them over both replicas
            ]
        finally:
            await nc.close()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
    codes = [r.error.code if r.error else "accepted" for r in replies]
    assert codes == ["accepted"] + ["replayed"] * 19
    assert await db.fetchval("SELECT count(*) FROM jobs") == 1
    assert (
        await db.fetchval("SELECT count(*) FROM outbox WHERE subject = 'muster.job.submitted'") == 1
    )


async def test_the_ledger_records_a_nonce_once_across_replicas_and_within_a_batch(
    database_url: str, db: asyncpg.Connection
) -> None:
    settings = Settings(database_url=database_url)
    pool_a, pool_b = await create_pool(settings), await create_pool(settings)
    try:
        a, b = NonceLedger(pool_a), NonceLedger(pool_b)
        later = time.time() + 60
        got = await asyncio.gather(
            a.first_time("k:1", later), a.first_time("k:1", later), a.first_time("k:2", later)
        )
        assert sorted(got) == [False, True, True]  # one of the two k:1 is the replay
        assert await b.first_time("k:2", later) is False  # the other replica's
        assert await b.first_time("k:3", later) is True
        await a.first_time("k:old", time.time() - 1)
        await a.sweep()
        assert await db.fetchval("SELECT count(*) FROM api_nonces WHERE nonce = 'k:old'") == 0
        await a.aclose(5)
        await b.aclose(5)
    finally:
        await pool_a.close()
        await pool_b.close()
