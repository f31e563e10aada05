"""Shell: which jobs this launcher replica owns (per-job ownership, by shard).

Every job belongs to one of `owners_core.SHARDS` shards, each a lease row in
`launcher_shards` (holder, fencing epoch, expiry by the database's clock). `hold`, every
ttl/4, renews this replica's shards, takes free or expired ones up to its fair share and
lets go of the excess (`owners_core.plan_shards`). Holder names are unique per process
incarnation, so a restarted replica is a new holder.

Two checks, one for each kind of act:
- a transaction writing a job's rows calls `lock(conn, job_id)` first: it checks holder
  and epoch in the database and holds the shard row (FOR SHARE) to the commit, so a
  takeover waits for it, and names this replica and its epoch to the `launcher_fence`
  trigger, which refuses a write to `job_runs`, `attempts` or `worker_exits` by a
  non-owner (one transaction acts on one job: a second shard's lock fails it closed);
- a call to a node agent first asks `owns(job_id)`: the shard was renewed less than a
  ttl ago by this process's monotonic clock (measured from before the renewal was
  sent), so a replica resumed from SIGSTOP after its lease ran out acts on no agent.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable

from services.launcher.owners_core import SHARDS, plan_shards, shard_of
from shared.db import Conn, idle_ms
from shared.logs import kv

log = logging.getLogger(__name__)


class Owners:
    def __init__(self, instance: str, ttl_s: float) -> None:
        self.holder = f"launcher-{instance}-{os.getpid()}-{secrets.token_hex(3)}"
        self.ttl_s = ttl_s
        self._held: dict[int, int] = {}  # shard -> epoch
        self._valid_until = 0.0  # monotonic: when the last renewal runs out

    def owns(self, job_id: int) -> bool:
        """Whether this replica may act on `job_id`'s workers now (no database call)."""
        margin = 0.1 * self.ttl_s
        return shard_of(job_id) in self._held and time.monotonic() < self._valid_until - margin

    def shards(self) -> list[int]:
        return sorted(self._held) if time.monotonic() < self._valid_until else []

    def mine(self, job_ids: Iterable[int]) -> list[int]:
        return [j for j in job_ids if self.owns(j)]

    async def lock(self, conn: Conn, job_id: int) -> bool:
        """In the caller's transaction: True if we own `job_id`, kept so to the commit."""
        shard = shard_of(job_id)
        if not self.owns(job_id):
            return False
        # The fence's settings (the trigger checks writes against them) and the shard
        # row held, in one round trip: this opens every transaction on a job. A
        # transaction left idle by a paused replica holds the shard row, and so any
        # takeover, until the server ends it: two ttls.
        found = await conn.fetchval(
            "SELECT s.found FROM (SELECT set_config('muster.launcher_holder', $1, true),"
            " set_config('muster.launcher_epoch', $2, true),"
            " set_config('idle_in_transaction_session_timeout', $3, true)) fence,"
            " LATERAL (SELECT true AS found FROM launcher_shards WHERE shard = $4"
            " AND holder = $1 AND epoch = $5 AND expires_at > now() FOR SHARE) s",
            self.holder,
            str(self._held[shard]),
            idle_ms(2 * self.ttl_s),
            shard,
            self._held[shard],
        )
        if not found:
            self._held.pop(shard, None)
            log.warning("lost a shard", extra=kv(shard=shard, holder=self.holder))
        return bool(found)

    async def hold(self, conn: Conn, busy: Callable[[int], bool]) -> list[int]:
        """One pass: renew, take, release; returns the shards just taken."""
        sent = time.monotonic()
        renewed = await conn.fetch(
            "UPDATE launcher_shards SET expires_at = now() + make_interval(secs => $2)"
            " WHERE holder = $1 AND expires_at > now() RETURNING shard, epoch",
            self.holder,
            self.ttl_s,
        )
        lost = sorted(set(self._held) - {r["shard"] for r in renewed})
        if lost:  # expired (we were paused or cut off) and perhaps taken by another
            log.warning("lost shards", extra=kv(shards=lost, holder=self.holder))
        self._held = {r["shard"]: r["epoch"] for r in renewed}
        self._valid_until = sent + self.ttl_s
        replicas = await self._seen(conn)
        busy_shards = frozenset(s for s in self._held if busy(s))
        plan = plan_shards(frozenset(self._held), replicas, busy_shards)
        if plan.release:
            for shard in plan.release:  # forgotten first: nothing acts on them after
                self._held.pop(shard, None)
            await conn.execute(
                "UPDATE launcher_shards SET expires_at = now() - interval '1 ms'"
                " WHERE holder = $1 AND shard = ANY($2::int[])",
                self.holder,
                list(plan.release),
            )
            log.info("released shards", extra=kv(shards=plan.release, replicas=replicas))
        taken = await self._take(conn, plan.take) if plan.take else []
        return taken

    async def _seen(self, conn: Conn) -> int:
        """Mark this replica seen; the number seen within a ttl, this one included."""
        await conn.execute(
            "INSERT INTO launcher_replicas(holder) VALUES ($1)"
            " ON CONFLICT (holder) DO UPDATE SET seen_at = now()",
            self.holder,
        )
        await conn.execute(
            "DELETE FROM launcher_replicas WHERE seen_at < now() - make_interval(secs => $1)",
            self.ttl_s * 10,
        )
        count: int = await conn.fetchval(
            "SELECT count(*) FROM launcher_replicas"
            " WHERE seen_at > now() - make_interval(secs => $1)",
            self.ttl_s,
        )
        return max(1, count)

    async def _take(self, conn: Conn, count: int) -> list[int]:
        rows = await conn.fetch(
            "UPDATE launcher_shards SET holder = $1, epoch = epoch + 1,"
            " expires_at = now() + make_interval(secs => $2)"
            " WHERE shard IN (SELECT shard FROM launcher_shards WHERE expires_at < now()"
            "   ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED)"
            " RETURNING shard, epoch",
            self.holder,
            self.ttl_s,
            count,
        )
        taken = {r["shard"]: r["epoch"] for r in rows}
        self._held.update(taken)
        if taken:
            log.info("took shards", extra=kv(shards=sorted(taken), holder=self.holder))
        return sorted(taken)

    async def release_all(self, conn: Conn) -> None:
        """At a clean stop: hand every shard over at once, not after the ttl."""
        self._held = {}
        await conn.execute(
            "UPDATE launcher_shards SET expires_at = now() - interval '1 ms' WHERE holder = $1",
            self.holder,
        )
        await conn.execute("DELETE FROM launcher_replicas WHERE holder = $1", self.holder)


__all__ = ["SHARDS", "Owners"]
