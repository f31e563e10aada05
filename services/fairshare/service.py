"""Fairshare shell: charges GPU-seconds to users and accounts exactly once.

Ticks and settlements carry an attempt's cumulative GPU-seconds; the charge is the
difference from what `usage_charges` already holds, taken under a row lock, so a
redelivered, repeated or reordered event charges nothing twice (invariant 6). The
inbox makes the settlement itself idempotent.
"""

from __future__ import annotations

import asyncio
import logging

from shared.db import Conn, inbox_first_time
from shared.events import AnyEvent, JobFinished, JobRequeued, UsageTicked
from shared.logs import kv
from shared.runtime import ServiceContext, until_stopped

log = logging.getLogger(__name__)

SUBJECTS = ("muster.job.finished", "muster.job.requeued", "muster.usage.ticked")
CONSUMER = "fairshare"


class FairShare:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    async def run(self, stop: asyncio.Event) -> None:
        await until_stopped(stop, self._consume)

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    async def handle(self, event: AnyEvent) -> None:
        match event:
            case UsageTicked():
                key = (event.job_id, event.attempt, event.user, event.account)
                total, settle = event.gpu_seconds_total, False
            case JobFinished():
                key = (event.job_id, event.attempt, event.user, event.account)
                total, settle = event.gpu_seconds, True
            case JobRequeued():
                key = (event.job_id, event.attempt, event.user, event.account)
                total, settle = event.gpu_seconds, False
            case _:
                return
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, event.event_id):
                return
            delta = await charge(conn, *key, total=total, settle=settle)
        if delta:
            log.debug("charged", extra=kv(job=key[0], user=key[2], gpu_s=round(delta, 3)))


async def charge(
    conn: Conn, job_id: int, attempt: int, user: str, account: str, *, total: float, settle: bool
) -> float:
    """Bring the attempt's charge up to `total`; returns what was added (never < 0)."""
    await conn.execute(
        "INSERT INTO usage_charges(job_id, attempt, user_name, account) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT DO NOTHING",
        job_id,
        attempt,
        user,
        account,
    )
    row = await conn.fetchrow(
        "SELECT charged, settled FROM usage_charges WHERE job_id = $1 AND attempt = $2 FOR UPDATE",
        job_id,
        attempt,
    )
    assert row is not None
    if row["settled"]:
        return 0.0
    delta = max(0.0, total - float(row["charged"]))
    await conn.execute(
        "UPDATE usage_charges SET charged = charged + $3, settled = settled OR $4,"
        " updated_at = now()"
        " WHERE job_id = $1 AND attempt = $2",
        job_id,
        attempt,
        delta,
        settle,
    )
    if delta > 0:
        await conn.execute(
            "INSERT INTO usage(user_name, account, gpu_seconds, decayed) VALUES ($1, $2, $3, $3)"
            " ON CONFLICT (user_name, account) DO UPDATE SET"
            " gpu_seconds = usage.gpu_seconds + $3, decayed = usage.decayed + $3,"
            " updated_at = now()",
            user,
            account,
            delta,
        )
    return delta
