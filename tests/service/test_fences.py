"""The chaos audit's fence check against a freshly migrated database, and that it
notices a fence gone (invariant 8's last line of defence)."""

from __future__ import annotations

import asyncpg

from tests.chaos import audit


async def test_every_fence_is_there_after_the_migrations(db: asyncpg.Connection) -> None:
    assert await audit.fences_in_place(db) == []
    await db.execute("ALTER TABLE attempts DISABLE TRIGGER attempts_fenced")
    [gone] = await audit.fences_in_place(db)
    assert gone.detail == "fence attempts_fenced on attempts is missing or disabled"
