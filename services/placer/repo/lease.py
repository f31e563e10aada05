"""Placer SQL, the leader lease: one placer acts at a time, fenced by an epoch
(`shared.lease` on the `placer_lease` row; a trigger on `allocations` also refuses an
insert from any other epoch).

Every function takes a connection; `lock_lease` runs inside the cycle's transaction and
holds the lease row for the rest of it, so cycles are serialised and a deposed leader's
cycle sees that it lost.
"""

from __future__ import annotations

from shared import lease
from shared.db import Conn


async def acquire_lease(conn: Conn, holder: str, ttl_s: float) -> int | None:
    """Take the leader lease if it is free or expired; returns the new fencing epoch."""
    return await lease.acquire(conn, "placer_lease", holder, ttl_s)


async def renew_lease(conn: Conn, holder: str, epoch: int, ttl_s: float) -> bool:
    return await lease.renew(conn, "placer_lease", holder, epoch, ttl_s)


async def lock_lease(conn: Conn, holder: str, epoch: int) -> bool:
    """Serialise cycles and check we still lead, for the rest of this transaction. No
    short idle limit: the core's pass between the snapshot and the writes may be long."""
    return await lease.lock(conn, "placer_lease", holder, epoch)


async def release_lease(conn: Conn, holder: str, epoch: int) -> bool:
    return await lease.release(conn, "placer_lease", holder, epoch)
