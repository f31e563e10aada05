"""Plumbing: the PostgreSQL pool, ordered migrations, the outbox and the inbox.

A service writes its state change and the events it owes in one transaction
(`outbox_add`); the `Relay` publishes them afterwards with `Nats-Msg-Id = event_id`. A
consumer calls `inbox_first_time` in the transaction that applies an event, so a
redelivered event has no second effect.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import NamedTuple, TypeAlias

import asyncpg

from shared.bus import Bus
from shared.events import Event, encode, subject_of
from shared.logs import kv
from shared.security import pg_ssl
from shared.settings import Settings
from shared.telemetry import event_headers
from shared.transient import Backoff, is_transient
from shared.waits import woken

log = logging.getLogger(__name__)


Conn: TypeAlias = (
    "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
)
Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"

MIGRATION_LOCK = 7_331_001
# A pending job's placement fields changed in place (admission's update) against the
# placer's preemptions planned for it by the old ones: advisory locks keyed by this and
# the job's id (`hold_job_changes`). Starts need none: their insert waits on the row.
JOB_CHANGE_LOCK = 7_331_002


async def create_pool(settings: Settings, *, min_size: int = 0, max_size: int = 5) -> Pool:
    """A pool whose every query has a deadline (see the `db_*` settings).

    asyncpg replaces a pooled connection that was closed under it at the next acquire,
    so after PostgreSQL restarts the pool reconnects by itself; the queries in flight
    fail with a transient error (`shared.transient`) and their callers retry. No
    minimum size: asyncpg would keep reconnecting to restore it during an outage and
    log a traceback each time; connections are made on demand and kept while used.
    """
    pool = await asyncpg.create_pool(
        settings.database_url,
        min_size=min_size,
        max_size=max_size,
        timeout=settings.db_connect_timeout_s,
        command_timeout=settings.db_command_timeout_s,
        ssl=pg_ssl(settings.db_tls_ca),  # None: as the URL says
        server_settings={
            # who holds a session, in pg_stat_activity (an operator's first question)
            "application_name": f"muster-{settings.service_name}-{settings.instance}"[:63],
            "statement_timeout": _ms(settings.db_statement_timeout_s),
            "lock_timeout": _ms(settings.db_lock_timeout_s),
            "idle_in_transaction_session_timeout": _ms(settings.db_idle_in_transaction_timeout_s),
        },
    )
    assert pool is not None
    return pool


async def hold_job_changes(conn: Conn, job_ids: Iterable[int], *, shared: bool) -> None:
    """Hold these jobs' change locks until the transaction ends: exclusive for the
    change, shared for a plan made by the fields read before it. Taken in id order, and
    after any row lock the same transaction takes (admission holds the jobs' rows first;
    the placer's allocation inserts take theirs first), so neither side can wait on the
    other in a circle. Ids past 32 bits share a key with another job: a needless wait,
    never a missed one."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    await conn.execute(
        f"SELECT {fn}($1, (id % 2147483648)::int) FROM unnest($2::bigint[]) AS id",
        JOB_CHANGE_LOCK,
        ids,
    )


async def idle_at_most(conn: Conn, seconds: float) -> None:
    """For the rest of this transaction, the server ends the session if it sits idle
    between statements longer than `seconds` (the pool's default is long). A transaction
    left open by a paused (SIGSTOPped) process holds its rows, and every replica that
    needs them waits, until then: callers whose work between statements is always short
    (no network, no long computing) keep that wait short."""
    await conn.execute(
        "SELECT set_config('idle_in_transaction_session_timeout', $1, true)", idle_ms(seconds)
    )


def idle_ms(seconds: float) -> str:
    """`idle_in_transaction_session_timeout`'s value for `seconds` (at least 1 ms)."""
    return f"{max(1, round(seconds * 1000))}ms"


def _ms(seconds: float) -> str:
    return str(round(seconds * 1000))


def migration_files() -> list[tuple[str, str]]:
    folder = resources.files("shared") / "migrations"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(name, (folder / name).read_text()) for name in names]


async def migrate(conn: Conn) -> list[str]:
    """Apply the migrations not yet applied, in order, under an advisory lock."""
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        # Asked first: a service's own role (docs/security.md) may not create tables,
        # and CREATE ... IF NOT EXISTS checks that right even when the table is there.
        if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
            await conn.execute(
                "CREATE TABLE schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        for name, sql in migration_files():
            if name in done:
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations(name) VALUES ($1)", name)
            applied.append(name)
    return applied


class OutboxRow(NamedTuple):
    """An outbox row as written: what the relay publishes."""

    event_id: uuid.UUID
    subject: str
    payload: bytes
    headers: str  # JSON


def outbox_rows(*events: Event) -> list[OutboxRow]:
    # Each row carries its job's trace where one is known (shared/telemetry.py).
    return [
        OutboxRow(e.event_id, subject_of(e), encode(e), json.dumps(event_headers(e)))
        for e in events
    ]


async def outbox_add(conn: Conn, *events: Event) -> list[OutboxRow]:
    """Record events to publish; call inside the transaction that made them true. The
    rows written, for `Relay.kick` after the commit."""
    rows = outbox_rows(*events)
    if rows:
        await conn.executemany(
            "INSERT INTO outbox(event_id, subject, payload, headers)"
            " VALUES ($1, $2, $3, $4::jsonb)",
            rows,
        )
    return rows


async def inbox_first_time(conn: Conn, consumer: str, event_id: uuid.UUID) -> bool:
    """True the first time `consumer` applies `event_id`; call inside its transaction."""
    row = await conn.fetchval(
        "INSERT INTO inbox(consumer, event_id) VALUES ($1, $2)"
        " ON CONFLICT DO NOTHING RETURNING true",
        consumer,
        event_id,
    )
    return bool(row)


class Relay:
    """Publishes committed outbox rows, oldest first; several relays may run at once.

    `kick()` after a commit publishes at once; a periodic sweep catches the rest, such
    as rows left by a process that died between its commit and its kick. `kick(rows)`
    with the rows the commit wrote (`outbox_add` returns them) publishes those as they
    are, without reading them back, unless something may wait before them (a plain
    kick, a failed pass or the periodic sweep since the last sweep): then the sweep
    publishes them, in order, with whatever else is there.
    """

    def __init__(
        self,
        pool: Pool,
        bus: Bus,
        *,
        sweep_s: float = 0.5,
        batch: int = 200,
        subjects: Sequence[str] | None = None,
    ) -> None:
        self.pool = pool
        self.subjects = list(subjects) if subjects is not None else None  # None: every row
        self.bus = bus
        self.sweep_s = sweep_s
        self.batch = batch
        self._wake = asyncio.Event()
        self._hand: list[OutboxRow] = []  # committed here, kicked with: not read back
        self._sweep = True  # rows may wait that are not in hand: the next pass sweeps

    def kick(self, rows: Sequence[OutboxRow] = ()) -> None:
        """After a commit: publish now. `rows`: what that commit wrote (all of it)."""
        if rows:
            self._hand.extend(r for r in rows if self._mine(r.subject))
        else:
            self._sweep = True
        self._wake.set()

    def _mine(self, subject: str) -> bool:
        return self.subjects is None or subject in self.subjects

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop`; an outage of either server only slows the sweep down
        (a kick still wakes it), so rows wait in the outbox and none is lost."""
        backoff = Backoff(first_s=self.sweep_s)
        while not stop.is_set():
            self._wake.clear()
            wait_s = self.sweep_s
            try:
                await self._pass()
                backoff.reset()
            except Exception as err:
                self._sweep = True  # what failed is published by the sweep, in order
                if not is_transient(err):
                    raise
                wait_s = backoff.next_s()
                log.warning("relay pass failed, will retry", extra=kv(error=repr(err)))
            if not await woken(self._wake, stop, wait_s):
                self._sweep = True  # the periodic sweep

    async def _pass(self) -> None:
        hand, self._hand = self._hand, []
        if self._sweep:
            self._sweep = False
            full = True
            while full:  # a full batch: more may wait behind it
                full = await self.publish_batch() == self.batch
        elif hand:
            await self.publish_rows(hand)

    async def publish_rows(self, rows: Sequence[OutboxRow]) -> None:
        """Publish rows in hand (committed), then mark those no other relay holds."""
        await asyncio.gather(
            *(
                self.bus.publish_raw(r.subject, r.payload, str(r.event_id), json.loads(r.headers))
                for r in rows
            )
        )
        async with self.pool.acquire() as conn:
            await conn.execute(
                "UPDATE outbox SET published_at = now() WHERE id IN (SELECT id FROM outbox"
                " WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL"
                " FOR UPDATE SKIP LOCKED)",
                [r.event_id for r in rows],
            )

    async def publish_batch(self) -> int:
        """Publish up to `batch` rows at once (JetStream acks awaited together), then mark
        them published in one statement. A failed publish leaves its whole batch to the
        next pass; re-publishes are dropped by `Nats-Msg-Id`."""
        async with self.pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT id, event_id, subject, payload, headers FROM outbox"
                " WHERE published_at IS NULL AND ($2::text[] IS NULL OR subject = ANY($2))"
                " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED",
                self.batch,
                self.subjects,
            )
            await asyncio.gather(
                *(
                    self.bus.publish_raw(
                        row["subject"],
                        bytes(row["payload"]),
                        str(row["event_id"]),
                        json.loads(row["headers"]) if row["headers"] else {},
                    )
                    for row in rows
                )
            )
            if rows:
                await conn.execute(
                    "UPDATE outbox SET published_at = now() WHERE id = ANY($1::bigint[])",
                    [r["id"] for r in rows],
                )
        return len(rows)
