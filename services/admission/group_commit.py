"""Plumbing: group commit, one database round trip for many concurrent callers.

Each caller queues an item and awaits its result; a flusher (at most `inflight` at a
time) takes up to `max_batch` queued items, writes them with one `write(items)` call
and resolves each caller with its result, in order. While one write is in flight the
next batch gathers, so under load a round trip serves hundreds of callers; alone, a
caller waits for no one. A failed write fails every caller of its batch (the write
stored none of them) and the next batch is tried. Used by the job batcher
(`batch.py`) and the replay ledger (`nonces.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from shared.runtime import TaskSet

I = TypeVar("I")  # noqa: E741 - an item, beside R its result
R = TypeVar("R")


class GroupCommit(Generic[I, R]):
    def __init__(
        self,
        write: Callable[[list[I]], Awaitable[list[R]]],
        *,
        max_batch: int,
        inflight: int = 1,
    ) -> None:
        self.write = write  # one result per item, in the items' order
        self.max_batch = max_batch
        self.inflight = inflight
        self._queue: list[tuple[I, asyncio.Future[R]]] = []
        self._flushers = 0
        self._tasks = TaskSet()  # flushers are owned: asyncio keeps only weak references

    async def submit(self, item: I) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._flushers < self.inflight:
            self._flushers += 1
            self._tasks.spawn(self._flush())
        return await future

    async def aclose(self, timeout_s: float) -> None:
        await self._tasks.close(timeout_s)

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                self._queue = self._queue[self.max_batch :]
                try:
                    results = await self.write([item for item, _ in batch])
                except Exception as err:  # every waiter hears of it; none hangs
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(err)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flushers -= 1
