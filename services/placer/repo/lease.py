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


async def lock_lease(conn: Conn, holder: str, epoch: int, idle_s: float) -> bool:
    """Serialise cycles and check we still lead, for the rest of this transaction. A
    leader paused inside it holds the lease row, and so every takeover, until the
    server ends its session after `idle_s` between two statements (twice the lease:
    a pass that long between its reads and its writes has let the lease run out anyway,
    as its renewal waits on the row it holds)."""
    return await lease.lock(conn, "placer_lease", holder, epoch, idle_s=idle_s)


async def release_lease(conn: Conn, holder: str, epoch: int) -> bool:
    return await lease.release(conn, "placer_lease", holder, epoch)
