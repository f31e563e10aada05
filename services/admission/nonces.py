"""Shell: the replay ledger every admission replica shares (table `api_nonces`).

A request that changes something (submit, cancel, hold, release, approve, drain,
resume, reload) records its nonce here before it acts; a nonce already there is a
replay sent to another replica. Concurrent requests are recorded in one statement per
batch (as `batch.py` group-commits jobs), so the ledger costs a round trip per batch,
not per request. Rows past `forget_at` are deleted by `sweep`.
"""

from __future__ import annotations

import asyncio

from shared.db import Pool
from shared.runtime import TaskSet

MAX_BATCH = 1000

_RECORD = """
INSERT INTO api_nonces(nonce, forget_at)
SELECT n, to_timestamp(f) FROM unnest($1::text[], $2::float8[]) AS t(n, f)
ON CONFLICT (nonce) DO NOTHING
RETURNING nonce
"""

_Item = tuple[str, float, "asyncio.Future[bool]"]


class NonceLedger:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._queue: list[_Item] = []
        self._flushing = False
        self._tasks = TaskSet()

    async def first_time(self, nonce: str, forget_at: float) -> bool:
        """True when no replica has seen `nonce` (it is recorded now)."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((nonce, forget_at, future))
        if not self._flushing:
            self._flushing = True
            self._tasks.spawn(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                try:
                    async with self.pool.acquire() as conn:
                        rows = await conn.fetch(
                            _RECORD, [n for n, _, _ in batch], [f for _, f, _ in batch]
                        )
                except Exception as err:  # every waiter hears of it; none hangs
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(err)
                    continue
                new = {r["nonce"] for r in rows}
                for nonce, _, future in batch:
                    if not future.done():
                        # the same nonce twice in one batch: only its first is new
                        future.set_result(nonce in new)
                        new.discard(nonce)
        finally:
            self._flushing = False

    async def aclose(self, timeout_s: float) -> None:
        await self._tasks.close(timeout_s)

    async def sweep(self) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute("DELETE FROM api_nonces WHERE forget_at < now()")
