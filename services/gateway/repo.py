"""SQL: the gateway's only direct reads of the database, for what the API has no
contract for — the GPUs held over time, for the utilisation chart. Read-only: every
query runs in a READ ONLY transaction; the gateway owns no table."""

from __future__ import annotations

from services.gateway.core import Interval
from shared.db import Conn

# One row per allocation that overlapped the window: when it was made, when released
# (NULL: still live), and how many GPUs it held.
_HELD = """
SELECT extract(epoch FROM a.created_at)::float8 AS start,
       extract(epoch FROM a.released_at)::float8 AS stop,
       count(*)::int AS gpus
FROM allocations a JOIN allocation_gpus g USING (alloc_id)
WHERE a.released_at IS NULL OR a.released_at > to_timestamp($1)
GROUP BY a.alloc_id
"""


async def held_since(conn: Conn, since: float) -> tuple[list[Interval], int]:
    """The GPU intervals overlapping [since, now] and the cluster's GPUs now."""
    async with conn.transaction(readonly=True):
        rows = await conn.fetch(_HELD, since)
        total: int = await conn.fetchval("SELECT count(*)::int FROM gpus")
    return [Interval(start=r["start"], end=r["stop"], gpus=r["gpus"]) for r in rows], total
