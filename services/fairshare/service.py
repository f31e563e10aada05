"""Fairshare shell: charges GPU-seconds exactly once, decays usage, ranks pending jobs,
and answers `muster share` / `muster acct` over NATS.

Charging: ticks and settlements carry an attempt's cumulative GPU-seconds; the pure
`accounting.charge` takes the difference from the attempt's `usage_charges` row, loaded
FOR UPDATE in the transaction that also records the event in the inbox and adds the
billed usage to the user association, so a redelivered, repeated or reordered event
charges nothing twice (invariant 6), whichever replica or restart handles it.

Decay: every `calc_period_s` one transaction locks `fairshare_state` and multiplies the
decayed usage by the half-life factor for the time since the last decay (or clears it at
a reset boundary); the multiplication happens in SQL, so no concurrent charge is lost.

Priorities: every `priority_period_s`, and soon after usage changes, one transaction
loads decayed usage and the pending jobs, the pure `ranking.rank` recomputes the share
table (Fair Tree or classic) and prices every job, and the result replaces
`job_priorities`, which the placer reads in its cycle transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import msgspec

from services.fairshare import repo
from services.fairshare.accounting import charge, tick_from_event
from services.fairshare.acct import (
    acct_rows,
    visible_acct_rows,
    visible_usage_rows,
)
from services.fairshare.api import (
    ACCT_VERB,
    CLUSTER_VERB,
    QUEUE_GROUP,
    REPORT_VERB,
    SHARE_VERB,
    SIZES_VERB,
    AcctReply,
    AcctRequest,
    ClusterReply,
    ClusterRequest,
    ReportReply,
    ReportRequest,
    ShareReply,
    ShareRequest,
    SizesReply,
    SizesRequest,
)
from services.fairshare.calculator import FairShareCalculator
from services.fairshare.cluster import ClusterView
from services.fairshare.cluster_report import cluster_usage
from services.fairshare.config import FairShareConfig
from services.fairshare.core import ShareRow
from services.fairshare.decay import decay_factor, period_start, reset_due
from services.fairshare.priority import PriorityBreakdown, PriorityWeights
from services.fairshare.ranking import RankPolicy, rank
from services.fairshare.report import below, report_rows, window
from services.fairshare.sizes_report import checked_grouping, size_rows
from shared.api import API_PREFIX
from shared.apiserve import Refused, Route, enveloped
from shared.db import Conn, inbox_first_time
from shared.events import AnyEvent, JobFinished, JobRequeued, UsageTicked
from shared.identity import R, Verifier, authenticated
from shared.identity_files import IdentitySource
from shared.logs import kv
from shared.retention import DAY_S
from shared.runtime import ServiceContext, every, until_stopped
from shared.settings import FairShareSettings
from shared.transient import is_transient
from shared.waits import woken

log = logging.getLogger(__name__)

SUBJECTS = ("muster.job.finished", "muster.job.requeued", "muster.usage.ticked")
CONSUMER = "fairshare"
MIN_RECOMPUTE_GAP_S = 1.0  # a burst of ticks triggers one recompute, not one each


class FairShare:
    def __init__(
        self,
        ctx: ServiceContext[FairShareSettings],
        config: FairShareConfig | None = None,
        cluster: ClusterView | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ctx = ctx
        # the hourly usage `muster report` reads
        ctx.pruner.keep_as_set(repo.PRUNE_USAGE_HOURS, ctx.settings.usage_keep_s, DAY_S)
        self.config = config or FairShareConfig()
        self.cluster = cluster or ClusterView()
        self.clock = clock
        self.weights = {**self.cluster.billing_weights, **self.config.billing_weights}
        self.priority_weights = _with_cluster_priorities(self.config.priority, self.cluster)
        self._wake = asyncio.Event()
        # Requests are verified as admission's are; the same file names users and keys.
        settings = ctx.settings
        self.identity = IdentitySource(settings.cluster_config, settings.user_keys_dir)
        self.verifier = Verifier(self.identity.directory)

    async def run(self, stop: asyncio.Event) -> None:
        await self.serve_api()
        try:
            await until_stopped(
                stop, self._consume, self._decay_loop, self._priority_loop, self.ctx.pruner.run
            )
        finally:
            await self.verifier.aclose()  # its signature batch, if one is in flight

    async def _consume(self, stop: asyncio.Event) -> None:
        await self.ctx.bus.consume(CONSUMER, SUBJECTS, self.handle, stop)

    # --- charging -------------------------------------------------------------------

    async def handle(self, event: AnyEvent) -> None:
        if not isinstance(event, UsageTicked | JobFinished | JobRequeued):
            return
        tick = tick_from_event(event)
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            if not await inbox_first_time(conn, CONSUMER, event.event_id):
                return
            state = await repo.lock_charge(conn, tick.job_id, tick.attempt, tick.user, tick.account)
            after, charged = charge(state, tick, self.weights)
            if after != state:
                await repo.save_charge(conn, after)
            if charged.gpu_seconds != 0:  # negative: a settlement giving back an overshoot
                await repo.add_usage(conn, charged)
        if charged.gpu_seconds != 0 or tick.final:
            self._wake.set()
        if charged.gpu_seconds != 0:
            log.debug(
                "charged",
                extra=kv(job=tick.job_id, user=tick.user, gpu_s=round(charged.gpu_seconds, 3)),
            )

    # --- decay ----------------------------------------------------------------------

    async def _decay_loop(self, stop: asyncio.Event) -> None:
        async def decay_now() -> None:
            await self.decay()

        await every(self.config.calc_period_s, stop, decay_now)

    async def decay(self, now: float | None = None) -> float:
        """Bring decayed usage up to `now`; returns the factor applied (0.0 for a reset)."""
        now = self.clock() if now is None else now
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            decayed_at, last_reset = await repo.lock_decay_state(conn)
            if now <= decayed_at:
                return 1.0
            reset = reset_due(last_reset, now, self.config.reset_period)
            factor = 0.0 if reset else decay_factor(now - decayed_at, self.config.half_life_s)
            new_reset = period_start(now, self.config.reset_period) if reset else last_reset
            await repo.apply_decay(conn, factor, now, reset=reset, last_reset=new_reset)
        log.info("usage decayed", extra=kv(factor=round(factor, 6), reset=reset))
        self._wake.set()
        return factor

    # --- priorities -----------------------------------------------------------------

    async def _priority_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.recompute()
            except Exception as err:
                if not is_transient(err):  # a bug: until_stopped logs and restarts the loop
                    raise
                log.warning("priority pass failed", extra=kv(error=repr(err)))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=MIN_RECOMPUTE_GAP_S)
            await woken(self._wake, stop, self.config.priority_period_s)
            self._wake.clear()

    async def recompute(self, now: float | None = None) -> dict[int, PriorityBreakdown]:
        """Fair share from current usage, then the priority of every pending job
        (`ranking.rank`): this only loads the facts and writes the result."""
        now = self.clock() if now is None else now
        t0 = time.perf_counter()
        async with self.ctx.pool.acquire() as conn, conn.transaction():
            await repo.lock_priorities(conn)  # replicas: one pass at a time
            usage = await repo.load_usage(conn)
            pending = await repo.load_pending(conn)
            policy = RankPolicy(
                tree=self.cluster.tree,
                shares=self.config.share_options,
                weights=self.priority_weights,
                cluster_gpus=await repo.cluster_gpus(conn),
            )
            out = rank(pending, usage, policy, now)
            await repo.write_priorities(conn, sorted(out.items()))
        log.info(
            "priorities",
            extra=kv(pending=len(out), ms=round((time.perf_counter() - t0) * 1000, 1)),
        )
        return out

    # --- API ------------------------------------------------------------------------

    async def serve_api(self) -> None:
        routes: dict[str, Callable[[bytes], Awaitable[msgspec.Struct]]] = {
            SHARE_VERB: self._signed(SHARE_VERB, ShareRequest, self.share),
            ACCT_VERB: self._signed(ACCT_VERB, AcctRequest, self.acct),
            REPORT_VERB: self._signed(REPORT_VERB, ReportRequest, self.report),
            CLUSTER_VERB: self._signed(CLUSTER_VERB, ClusterRequest, self.cluster_report),
            SIZES_VERB: self._signed(SIZES_VERB, SizesRequest, self.sizes_report),
        }
        for verb, route in routes.items():
            await self.ctx.bus.serve(API_PREFIX + verb, QUEUE_GROUP, enveloped(route))

    def _signed(
        self, verb: str, kind: type[R], fn: Callable[[R], Awaitable[msgspec.Struct]]
    ) -> Route:
        return authenticated(self.verifier, API_PREFIX + verb, kind, fn, time.time)

    async def share(self, req: ShareRequest) -> ShareReply:
        now = self.clock()
        async with self.ctx.pool.acquire() as conn, conn.transaction(readonly=True):
            usage = await repo.load_usage(conn)
            decayed_at, _ = await _decay_state(conn)
        # show usage as of now, not as of the last decay pass
        f = decay_factor(now - decayed_at, self.config.half_life_s)
        calc = FairShareCalculator(self.cluster.tree, self.config.share_options)
        calc.update(by_assoc={k: v * f for k, v in usage.items()})
        return ShareReply(
            algorithm=self.config.algorithm,
            half_life_s=self.config.half_life_s,
            rows=visible_usage_rows(
                filter_share_rows(calc.rows, req.accounts, req.users),
                req.user,
                self.identity.directory(),
            ),
        )

    async def acct(self, req: AcctRequest) -> AcctReply:
        async with self.ctx.pool.acquire() as conn, conn.transaction(readonly=True):
            jobs, attempts, charges = await repo.acct_records(
                conn,
                job_ids=req.job_ids,
                users=req.users,
                accounts=req.accounts,
                since=req.since,
                until=req.until,
                limit=req.limit,
            )
            ids = [int(str(j["job_id"])) for j in jobs]
            steps = await repo.acct_steps(conn, ids) if req.steps else []
        rows = acct_rows(
            jobs, attempts, charges, per_attempt=req.attempts, states=req.states, steps=steps
        )
        return AcctReply(rows=tuple(visible_acct_rows(rows, req.user, self.identity.directory())))

    async def report(self, req: ReportRequest) -> ReportReply:
        """Usage over whole hours (report.py). Account rows are everyone's to see, as
        share's are; a user's row only for whoever may see that user's usage."""
        try:
            since, until = window(req.since, req.until, self.clock())
        except ValueError as err:
            raise Refused(str(err), "invalid") from err
        tree = {a.name: a.parent for a in self.cluster.tree.accounts}
        accounts = below(req.accounts, tree)  # a named account counts its sub-accounts
        async with self.ctx.pool.acquire() as conn, conn.transaction(readonly=True):
            usage = await repo.usage_by_hour(conn, since, until, accounts, req.users)
        shown = {a: p for a, p in tree.items() if not accounts or a in accounts}
        rows = report_rows(usage, by_user=req.by_user, parents=shown)
        visible = visible_usage_rows(rows, req.user, self.identity.directory())
        return ReportReply(cluster=self.cluster.name, since=since, until=until, rows=visible)

    async def cluster_report(self, req: ClusterRequest) -> ClusterReply:
        """The cluster's GPU time per state over whole hours (cluster_report.py): the
        cluster's, everyone's to see, as sreport's cluster Utilization is."""
        try:
            since, until = window(req.since, req.until, self.clock())
        except ValueError as err:
            raise Refused(str(err), "invalid") from err
        async with self.ctx.pool.acquire() as conn, conn.transaction(readonly=True):
            by_state = await repo.gpu_time_by_state(conn, since, until)
        return ClusterReply(
            cluster=self.cluster.name, since=since, until=until, usage=cluster_usage(by_state)
        )

    async def sizes_report(self, req: SizesRequest) -> SizesReply:
        """Allocated GPU time by job size per account (sizes_report.py): per account, not
        per user, so everyone's to see, as share's account rows are."""
        try:
            since, until = window(req.since, req.until, self.clock())
            grouping = checked_grouping(req.grouping)
        except ValueError as err:
            raise Refused(str(err), "invalid") from err
        parents = {a.name: a.parent for a in self.cluster.tree.accounts}
        unknown = sorted(set(req.accounts) - set(parents))
        if unknown:
            known = ", ".join(sorted(parents)) or "none"
            raise Refused(f"no account {', '.join(unknown)}; accounts: {known}", "invalid")
        async with self.ctx.pool.acquire() as conn, conn.transaction(readonly=True):
            allocated = await repo.allocated_in(conn, since, until)
        rows = size_rows(allocated, grouping, parents, req.accounts)
        return SizesReply(
            cluster=self.cluster.name, since=since, until=until, grouping=grouping, rows=tuple(rows)
        )


async def _decay_state(conn: Conn) -> tuple[float, float | None]:
    row = await conn.fetchrow(
        "SELECT extract(epoch FROM decayed_at)::float8 AS d,"
        " extract(epoch FROM last_reset)::float8 AS r FROM fairshare_state WHERE id = 1"
    )
    assert row is not None
    return float(row["d"]), row["r"]


def filter_share_rows(
    rows: tuple[ShareRow, ...], accounts: tuple[str, ...], users: tuple[str, ...]
) -> tuple[ShareRow, ...]:
    """Root, then the rows of the named accounts and users (all rows when none named)."""
    return tuple(
        r
        for r in rows
        if r.depth == 0
        or (
            (not accounts or r.account in accounts)
            and (not users or r.user is None or r.user in users)
        )
    )


def _with_cluster_priorities(weights: PriorityWeights, cluster: ClusterView) -> PriorityWeights:
    """QOS and partition priorities from the cluster config unless set here."""
    return msgspec.structs.replace(
        weights,
        qos_priorities=weights.qos_priorities or cluster.qos_priorities,
        partition_priorities=weights.partition_priorities or cluster.partition_priorities,
    )
