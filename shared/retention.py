"""Plumbing: the outbox and the inbox are trimmed, so neither grows with the cluster's age.

Every event a service commits stays in the outbox after the relay published it, and every
event a consumer applied leaves an inbox row; before this, nothing removed either, and
both grew by several rows per job for ever. The `Pruner`, one owned loop in every service
process, removes in bounded batches:

- outbox rows published more than `outbox_keep_s` ago (7 days by default, what the stream
  keeps), except the node faults: the XID counts and the fault-to-restart histogram are
  read from those (`services/health/metrics.py`, `services/launcher/metrics.py`), they are
  few, and they have their own index (migration 0022). A row not yet published is never
  removed;
- inbox rows applied more than `inbox_keep_s` ago. An inbox row is what makes a
  redelivered event a no-op, so it is kept at least as long as the stream can still
  deliver that event (`STREAM_MAX_AGE_S`) plus a day (`INBOX_FLOOR_S`), whatever the
  setting says.

Each statement reads at most `batch` rows from the head of an index (the outbox's key in
id order, the inbox's `applied_at`, migration 0023), so a pass costs the same on a table
of a day's rows or of a year's. Rows another process is removing are skipped, not waited
for: every service runs a pruner, and they share the work. A pass takes at most
`ROUNDS` batches a table; one that leaves old rows behind (a backlog: a week of a busy
cluster, or a first start on an old database) is followed by the next a second later,
not a period later. Measured on this machine (5,000-row batches, 200,000 rows a table,
half of them old): 13 ms a batch, 12 ms for a pass that finds nothing old.

A service may also hand its pruner a record table of its own (`Pruner.keep`), kept as
long as the events (the placer's cycle log) or as long as it says (the hourly usage,
fairshare's, and GPU time, health's; admission's purge of finished jobs, a function
that removes a job with all its rows: services/admission/purge.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import NamedTuple

from shared.bus import STREAM_MAX_AGE_S
from shared.db import Pool
from shared.logs import kv
from shared.waits import woken

log = logging.getLogger(__name__)

DAY_S = 24 * 3600.0
INBOX_FLOOR_S = STREAM_MAX_AGE_S + DAY_S
KEPT_SUBJECTS = ("muster.node.fault",)  # the metrics' record: never pruned
ROUNDS = 20  # batches a table's pass takes at most: one pass never holds for long
BACKLOG_PAUSE_S = 1.0  # between passes while old rows are left (a backlog)

# The outbox's head in id order (its key): published rows, the kept subjects skipped.
# The LIMIT bounds what is read whether or not any of it is old enough; the rows go by
# key (`= ANY` of an array: an index scan, never a join over the whole table).
PRUNE_OUTBOX = """
DELETE FROM outbox WHERE id = ANY(ARRAY(
  SELECT id FROM (
    SELECT id, published_at FROM outbox
     WHERE published_at IS NOT NULL AND subject <> ALL($3::text[])
     ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED
  ) head WHERE published_at < now() - make_interval(secs => $1)
))
"""


def trim_oldest(table: str, column: str) -> str:
    """The trim of a table by age: at most `$2` of its rows older than `$1` seconds by
    `column`, read from the head of an index that `column` leads, skipping rows another
    pruner holds; they go by their row address."""
    return f"""
DELETE FROM {table} WHERE ctid = ANY(ARRAY(
  SELECT ctid FROM {table}
   WHERE {column} < now() - make_interval(secs => $1)
   ORDER BY {column} LIMIT $2 FOR UPDATE SKIP LOCKED
))
"""


# The inbox's oldest rows (migration 0023's index).
PRUNE_INBOX = trim_oldest("inbox", "applied_at")


class Kept(NamedTuple):
    """One of a service's own record tables, trimmed by its pruner: `sql` removes at most
    `$2` rows older than `$1` seconds (bounded as the outbox's and inbox's are)."""

    sql: str
    keep_s: float | None = None  # None: as long as the outbox keeps events
    counts: bool = False  # `sql` returns how many it removed, instead of a DELETE status


class Retention(NamedTuple):
    outbox_keep_s: float = STREAM_MAX_AGE_S
    inbox_keep_s: float = INBOX_FLOOR_S
    every_s: float = 600.0
    batch: int = 5_000


DEFAULT = Retention()


class Pruned(NamedTuple):
    outbox: int
    inbox: int
    own: int = 0  # rows of the service's own record tables (`Pruner.keep`)
    more: bool = False  # a table's last batch was full when the pass took its rounds


def inbox_keep_s(asked_s: float) -> float:
    """What the inbox keeps: as asked, but never less than the stream can redeliver."""
    return max(asked_s, INBOX_FLOOR_S)


def kept_for(asked_s: float, floor_s: float) -> float | None:
    """How long a record table of a service's own keeps its rows: as asked but never less
    than `floor_s`; None (kept for ever) when asked 0 or less."""
    return None if asked_s <= 0 else max(asked_s, floor_s)


def go_on(removed: int, batch: int, rounds: int) -> bool:
    """Another batch: the last one was full (more may be old enough) and the pass has
    rounds left."""
    return removed >= batch and rounds < ROUNDS


def _count(status: str) -> int:
    """Rows a `DELETE n` status names."""
    return int(status.rsplit(" ", 1)[-1])


async def prune(pool: Pool, retention: Retention, own: Sequence[Kept] = ()) -> Pruned:
    """One pass over the outbox, the inbox and `own`, a service's own record tables."""
    keep_s, batch = retention.outbox_keep_s, retention.batch
    outbox = await _trim(pool, PRUNE_OUTBOX, (keep_s, batch, list(KEPT_SUBJECTS)), batch)
    inbox = await _trim(pool, PRUNE_INBOX, (inbox_keep_s(retention.inbox_keep_s), batch), batch)
    mine = [
        await _trim(pool, k.sql, (keep_s if k.keep_s is None else k.keep_s, batch), batch, k.counts)
        for k in own
    ]
    more = any(left for _, left in (outbox, inbox, *mine))
    return Pruned(outbox[0], inbox[0], sum(n for n, _ in mine), more)


async def _trim(
    pool: Pool, sql: str, args: tuple[object, ...], batch: int, counts: bool = False
) -> tuple[int, bool]:
    """Batches of `sql`, each its own short transaction, while they come full and the
    pass has rounds left: (rows removed, whether the last batch was full). With `counts`
    the statement returns the number it removed (a function's); else its status says."""
    removed, rounds, last = 0, 0, batch
    while go_on(last, batch, rounds):
        async with pool.acquire() as conn:
            if counts:
                last = int(await conn.fetchval(sql, *args))
            else:
                last = _count(await conn.execute(sql, *args))
        removed += last
        rounds += 1
    return removed, last >= batch


def pause_s(pruned: Pruned, every_s: float) -> float:
    """Until the next pass: a period, or a moment when the last pass left old rows
    behind (a backlog goes at `ROUNDS` batches a second, not a pass a period)."""
    return min(BACKLOG_PAUSE_S, every_s) if pruned.more else every_s


class Pruner:
    """Trims the outbox, the inbox and the service's own record tables (`keep`) every
    `every_s` until `stop`; the first pass comes one period after the start, so a
    restarting service does not begin with it."""

    def __init__(self, pool: Pool, retention: Retention = DEFAULT) -> None:
        self.pool = pool
        self.retention = retention
        self.own: list[Kept] = []  # statements trimming the service's record tables

    def keep(self, sql: str, keep_s: float | None = None, *, counts: bool = False) -> None:
        """Trim one of this service's own tables too (its role may delete there), as
        `Kept` says: rows older than `keep_s` (default: what the outbox keeps) go."""
        self.own.append(Kept(sql, keep_s, counts))

    def keep_as_set(
        self, sql: str, asked_s: float, floor_s: float, *, counts: bool = False
    ) -> float | None:
        """`keep` for a table kept as a setting says (`kept_for`: never less than
        `floor_s`; 0 or less keeps it for ever, and nothing is trimmed): how long."""
        keep_s = kept_for(asked_s, floor_s)
        if keep_s is not None:
            self.keep(sql, keep_s, counts=counts)
        return keep_s

    async def run(self, stop: asyncio.Event) -> None:
        never = asyncio.Event()
        wait_s = self.retention.every_s
        while not await woken(never, stop, wait_s):
            pruned = await prune(self.pool, self.retention, self.own)
            if pruned.outbox or pruned.inbox or pruned.own:
                log.info(
                    "pruned", extra=kv(outbox=pruned.outbox, inbox=pruned.inbox, own=pruned.own)
                )
            wait_s = pause_s(pruned, self.retention.every_s)
