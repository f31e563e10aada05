"""Placer SQL, the leader lease: one placer acts at a time, fenced by an epoch.

Every function takes a connection; `lock_lease` runs inside the cycle's transaction and
holds the lease row for the rest of it, so cycles are serialised and a deposed leader's
cycle sees that it lost.
"""

from __future__ import annotations

from shared.db import Conn


async def acquire_lease(conn: Conn, holder: str, ttl_s: float) -> int | None:
    """Take the leader lease if it is free or expired; returns the new fencing epoch."""
    epoch: int | None = await conn.fetchval(
        "INSERT INTO placer_lease AS l (id, holder, epoch, expires_at)"
        " VALUES (1, $1, 1, now() + make_interval(secs => $2))"
        " ON CONFLICT (id) DO UPDATE SET holder = $1, epoch = l.epoch + 1,"
        "   expires_at = now() + make_interval(secs => $2)"
        " WHERE l.expires_at < now() RETURNING epoch",
        holder,
        ttl_s,
    )
    return epoch


async def renew_lease(conn: Conn, holder: str, epoch: int, ttl_s: float) -> bool:
    row = await conn.fetchval(
        "UPDATE placer_lease SET expires_at = now() + make_interval(secs => $3)"
        " WHERE id = 1 AND holder = $1 AND epoch = $2 RETURNING true",
        holder,
        epoch,
        ttl_s,
    )
    return bool(row)


async def lock_lease(conn: Conn, holder: str, epoch: int) -> bool:
    """Serialise cycles and check we still lead, for the rest of this transaction."""
    row = await conn.fetchval(
        "SELECT true FROM placer_lease WHERE id = 1 AND holder = $1 AND epoch = $2"
        " AND expires_at > now() FOR UPDATE",
        holder,
        epoch,
    )
    return bool(row)
