"""Plumbing: a singleton lease row with a fencing epoch, for a service whose replicas
must take turns acting (the placer, the health monitor's liveness pass).

A lease table has one row (`id = 1`): `holder`, `epoch`, `expires_at`, all judged by
the database's clock. Taking an expired or free lease bumps the epoch; the holder
renews it; a transaction that acts first locks the row with `lock` and checks its
epoch, so taking over waits for that transaction and a deposed holder's next one sees
it lost (a SIGSTOPped leader resumed after a takeover writes nothing). Every function
takes a connection; `lock` holds the row for the rest of the caller's transaction.
"""

from __future__ import annotations

from typing import Literal

from shared.db import Conn, idle_ms

# The lease tables; a name is spliced into SQL, so only these are accepted.
LeaseTable = Literal["placer_lease", "health_lease"]


async def acquire(conn: Conn, table: LeaseTable, holder: str, ttl_s: float) -> int | None:
    """Take the lease if it is free or expired; returns the new fencing epoch."""
    epoch: int | None = await conn.fetchval(
        f"INSERT INTO {table} AS l (id, holder, epoch, expires_at)"
        " VALUES (1, $1, 1, now() + make_interval(secs => $2))"
        " ON CONFLICT (id) DO UPDATE SET holder = $1, epoch = l.epoch + 1,"
        "   expires_at = now() + make_interval(secs => $2)"
        " WHERE l.expires_at < now() RETURNING epoch",
        holder,
        ttl_s,
    )
    return epoch


async def renew(conn: Conn, table: LeaseTable, holder: str, epoch: int, ttl_s: float) -> bool:
    row = await conn.fetchval(
        f"UPDATE {table} SET expires_at = now() + make_interval(secs => $3)"
        " WHERE id = 1 AND holder = $1 AND epoch = $2 RETURNING true",
        holder,
        epoch,
        ttl_s,
    )
    return bool(row)


async def release(conn: Conn, table: LeaseTable, holder: str, epoch: int) -> bool:
    """Let the lease expire now (a clean stop), so a standby takes it at its next try
    instead of waiting out the TTL; a lease someone else holds is left alone."""
    row = await conn.fetchval(
        f"UPDATE {table} SET expires_at = now() WHERE id = 1 AND holder = $1 AND epoch = $2"
        " RETURNING true",
        holder,
        epoch,
    )
    return bool(row)


async def lock(
    conn: Conn, table: LeaseTable, holder: str, epoch: int, *, idle_s: float | None = None
) -> bool:
    """Check we still hold the lease, and keep it ours for the rest of this transaction.

    A transaction left idle by a paused (SIGSTOPped) process holds the row, and with it
    every takeover, until the server ends the session (the pool's idle-in-transaction
    timeout); `idle_s` shortens that for this transaction, for callers whose work
    between statements is always short. One round trip either way: the limit is set
    in the statement that takes the row."""
    held = (
        f"SELECT true AS held FROM {table} WHERE id = 1 AND holder = $1 AND epoch = $2"
        " AND expires_at > now() FOR UPDATE"
    )
    if idle_s is None:
        return bool(await conn.fetchval(held, holder, epoch))
    row = await conn.fetchval(
        "SELECT s.held FROM (SELECT set_config('idle_in_transaction_session_timeout', $3,"
        f" true)) idle, LATERAL ({held}) s",
        holder,
        epoch,
        idle_ms(idle_s),
    )
    return bool(row)


class Lease:
    """One replica's hold on a lease table: `hold` (every ttl/3) renews it or takes it
    when free; `epoch` is None while another replica holds it."""

    def __init__(self, table: LeaseTable, holder: str, ttl_s: float) -> None:
        self.table: LeaseTable = table
        self.holder = holder
        self.ttl_s = ttl_s
        self.epoch: int | None = None

    async def hold(self, conn: Conn) -> bool:
        """Renew, or take the lease if it is free; True when it was just taken."""
        if self.epoch is not None and await renew(
            conn, self.table, self.holder, self.epoch, self.ttl_s
        ):
            return False
        self.epoch = await acquire(conn, self.table, self.holder, self.ttl_s)
        return self.epoch is not None

    async def release(self, conn: Conn) -> bool:
        """Give the lease up (a clean stop); True when we held it."""
        epoch, self.epoch = self.epoch, None
        return epoch is not None and await release(conn, self.table, self.holder, epoch)

    async def lock(self, conn: Conn, *, idle_s: float | None = None) -> bool:
        """`lock` with our epoch, in the caller's transaction; a lost lease is forgotten."""
        if self.epoch is None:
            return False
        if await lock(conn, self.table, self.holder, self.epoch, idle_s=idle_s):
            return True
        self.epoch = None
        return False
