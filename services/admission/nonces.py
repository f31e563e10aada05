"""Shell: the replay ledger every admission replica shares (table `api_nonces`).

A request that changes something (submit, cancel, hold, release, approve, drain,
resume, reload) records its nonce here before it acts; a nonce already there is a
replay sent to another replica. Concurrent requests are recorded in one statement per
batch (`group_commit.py`, as `batch.py` commits jobs), so the ledger costs a round trip per batch,
not per request. Rows past `forget_at` are deleted by `sweep`.
"""

from __future__ import annotations

from shared.db import Pool

from .group_commit import GroupCommit

MAX_BATCH = 1000

_RECORD = """
INSERT INTO api_nonces(nonce, forget_at)
SELECT n, to_timestamp(f) FROM unnest($1::text[], $2::float8[]) AS t(n, f)
ON CONFLICT (nonce) DO NOTHING
RETURNING nonce
"""


class NonceLedger:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._commits = GroupCommit(self._record, max_batch=MAX_BATCH)

    async def first_time(self, nonce: str, forget_at: float) -> bool:
        """True when no replica has seen `nonce` (it is recorded now)."""
        return await self._commits.submit((nonce, forget_at))

    async def _record(self, batch: list[tuple[str, float]]) -> list[bool]:
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(_RECORD, [n for n, _ in batch], [f for _, f in batch])
        new = {r["nonce"] for r in rows}
        firsts = []
        for nonce, _ in batch:  # the same nonce twice in one batch: only its first is new
            firsts.append(nonce in new)
            new.discard(nonce)
        return firsts

    async def aclose(self, timeout_s: float) -> None:
        await self._commits.aclose(timeout_s)

    async def sweep(self) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM api_nonces WHERE forget_at < now()")
