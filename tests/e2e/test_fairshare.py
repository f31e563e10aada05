"""Fair share on real NATS and PostgreSQL: usage charged exactly once whatever is
redelivered or killed, decay, priorities for the placer, and the share/acct/report API."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import asyncpg
import msgspec
import pytest

from muster.cli_accounting import register
from muster.client import ApiRefused, call
from muster.cluster import Cluster
from services.fairshare.api import (
    AcctReply,
    AcctRequest,
    ReportReply,
    ReportRequest,
    ShareReply,
    ShareRequest,
)
from services.fairshare.cluster import ClusterView
from services.fairshare.config import FairShareConfig
from services.fairshare.decay import HALF_LIFE_DEFAULT_S, ResetPeriod
from services.fairshare.render import SHARE_COLUMNS
from services.fairshare.report import ReportRow
from services.fairshare.service import FairShare
from services.fairshare.tree import Account, AccountTree, UserAssoc
from shared.events import JobFinished, JobRequeued, UsageTicked
from shared.jobspec import JobSpec
from shared.runtime import ServiceContext, service_context
from shared.settings import FairShareSettings
from tests.support.cluster import (
    eventually,
    identity_settings,
    job_state,
    kill9,
    make_cluster,
    nodes,
    nodes_up,
    submit,
)

T = TypeVar("T")
T0 = datetime(2027, 1, 13, 12, 0, tzinfo=UTC).timestamp()  # a Wednesday, noon UTC

CLUSTER = ClusterView(
    tree=AccountTree(
        accounts=(Account(name="research", shares=70), Account(name="prod", shares=30)),
        users=(
            UserAssoc(user="alice", account="research"),
            UserAssoc(user="dave", account="prod"),
        ),
    ),
    billing_weights={"H100": 2.0},
)


@pytest.fixture
async def ctx(
    nats_url: str, database_url: str, tmp_path: Path
) -> AsyncIterator[ServiceContext[FairShareSettings]]:
    identity = identity_settings(tmp_path)  # requests are signed; root is an operator
    settings = FairShareSettings(
        nats_url=nats_url,
        database_url=database_url,
        service_name="fairshare",
        **identity,
    )
    async with service_context(settings) as c:
        yield c


def tick(
    job: int,
    total: float,
    attempt: int = 1,
    user: str = "alice",
    account: str = "",
    **kw: object,
) -> UsageTicked:
    account = account or ("research" if user == "alice" else "prod")
    return UsageTicked(
        job_id=job,
        attempt=attempt,
        user=user,
        account=account,
        gpu_model="H100",
        gpu_seconds_total=total,
        **kw,  # type: ignore[arg-type]
    )


async def seed_job(db: asyncpg.Connection, user: str, account: str, gpus: int = 4) -> int:
    spec = JobSpec(user=user, account=account, script="#!/bin/bash\n", gpus_per_node=gpus)
    job_id: int = await db.fetchval(
        "INSERT INTO jobs(name, user_name, account, partition, qos, nodes_min, nodes_max,"
        " gpus_per_node, time_limit_s, spec) VALUES ('job', $1, $2, 'normal', 'normal', 1, 1,"
        " $3, 3600, $4::jsonb) RETURNING job_id",
        user,
        account,
        gpus,
        msgspec.json.encode(spec).decode(),
    )
    return job_id


async def test_redelivered_repeated_and_late_ticks_charge_the_final_cumulative_once(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection
) -> None:
    fs = FairShare(ctx, FairShareConfig(), CLUSTER, clock=lambda: T0)
    first = tick(7, 10.0)
    events: list[UsageTicked | JobRequeued | JobFinished] = [
        first,
        first,  # redelivered: the inbox drops it
        tick(7, 20.0),
        tick(7, 20.0),  # re-emitted with a new id: charges the difference, 0
        tick(7, 15.0),  # late: never a refund
        JobRequeued(job_id=7, attempt=1, reason="node fault", gpu_seconds=30.0, user="alice",
                    account="research"),
        tick(7, 30.0),  # the launcher's tick that rides along with the requeue
        tick(7, 99.0),  # after settlement: nothing
        tick(7, 5.0, attempt=2),
        JobFinished(job_id=7, attempt=2, state="COMPLETED", user="alice", account="research",
                    gpu_seconds=12.5),
    ]  # fmt: skip
    for event in events:
        await fs.handle(event)
    await fs.handle(events[-1])

    rows = await db.fetch("SELECT attempt, charged, billed, settled FROM usage_charges ORDER BY 1")
    assert [tuple(r) for r in rows] == [(1, 30.0, 60.0, True), (2, 12.5, 25.0, True)]
    usage = await db.fetchrow("SELECT gpu_seconds, billed, decayed FROM usage")
    assert usage is not None
    assert tuple(usage) == (42.5, 85.0, 85.0)


async def test_decay_halves_usage_each_half_life_and_a_reset_period_clears_it(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection
) -> None:
    await db.execute("UPDATE fairshare_state SET decayed_at = to_timestamp($1)", T0)
    fs = FairShare(ctx, FairShareConfig(), CLUSTER)
    await fs.handle(tick(1, 100.0))
    assert await fs.decay(T0 + HALF_LIFE_DEFAULT_S) == pytest.approx(0.5)
    assert await db.fetchval("SELECT decayed FROM usage") == pytest.approx(100.0)
    assert await fs.decay(T0 + 2 * HALF_LIFE_DEFAULT_S) == pytest.approx(0.5)
    assert await db.fetchval("SELECT decayed FROM usage") == pytest.approx(50.0)
    assert await db.fetchval("SELECT gpu_seconds FROM usage") == 100.0  # raw is kept

    daily = FairShare(ctx, FairShareConfig(reset_period=ResetPeriod.DAILY), CLUSTER)
    assert await daily.decay(T0 + 2 * HALF_LIFE_DEFAULT_S + 3600) == 0.0
    assert await db.fetchval("SELECT decayed FROM usage") == 0.0
    assert await daily.decay(T0 + 2 * HALF_LIFE_DEFAULT_S + 7200) > 0.0  # not again that day


async def test_pending_jobs_of_the_account_under_its_share_rank_first(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection
) -> None:
    heavy = await seed_job(db, "alice", "research")
    light = await seed_job(db, "dave", "prod")
    fs = FairShare(ctx, FairShareConfig(), CLUSTER, clock=lambda: T0)
    await fs.handle(tick(900, 1000.0))  # research used much
    await fs.handle(tick(901, 10.0, user="dave"))

    got = await fs.recompute(T0)

    assert got[light].total > got[heavy].total
    rows = {r["job_id"]: r for r in await db.fetch("SELECT * FROM job_priorities")}
    assert set(rows) == {heavy, light}
    factors = msgspec.json.decode(rows[light]["factors"])
    assert factors["fairshare"] == 10000.0 and factors["factors"]["fairshare"] == 1.0
    assert rows[light]["total"] == got[light].total


async def test_a_newcomer_outranks_everyone_in_the_same_pass(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection
) -> None:
    light = await seed_job(db, "dave", "prod")
    newcomer = await seed_job(db, "zoe", "startup")  # an account not configured, no usage
    fs = FairShare(ctx, FairShareConfig(), CLUSTER, clock=lambda: T0)
    await fs.handle(tick(901, 10.0, user="dave"))

    got = await fs.recompute(T0)

    assert got[newcomer].factors.fairshare == 1.0
    assert got[light].factors.fairshare < 1.0  # ranked among three, not two
    assert got[newcomer].total > got[light].total


def cli(state: Path, url: str, *argv: str) -> str:
    """Run a `muster share`/`muster acct` command line; its stdout."""
    (state / "cluster.json").write_text(json.dumps({"nats_url": url}))
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", default=str(state))
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert args.fn(args) == 0
    return out.getvalue()


async def test_share_and_acct_answer_over_nats_in_their_queue_group(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection, nats_url: str, tmp_path: Path
) -> None:
    job = await seed_job(db, "alice", "research")
    fs = FairShare(ctx, FairShareConfig(), CLUSTER)
    await fs.handle(tick(job, 40.0))
    await fs.handle(
        JobFinished(job_id=job, attempt=1, state="COMPLETED", user="alice", account="research",
                    gpu_seconds=50.0, exit_code=0)
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(fs.run(stop))
    try:
        share = await eventually(
            lambda: _call(nats_url, "share", ShareRequest(user="root"), ShareReply),
            lambda r: r is not None,
            what="share reply",
        )
        assert share is not None
        by = {(r.account, r.user): r for r in share.rows}
        assert by[("research", None)].raw_shares == 70
        assert by[("research", None)].norm_shares == pytest.approx(0.7)
        assert by[("research", "alice")].raw_usage == pytest.approx(100.0, rel=1e-3)  # H100 x2
        assert by[("prod", "dave")].fairshare == 1.0  # no usage: ranked first
        assert by[("research", "alice")].fairshare == 0.5

        acct = await call(nats_url, "acct", AcctRequest(user="alice", job_ids=(job,)), AcctReply)
        assert [(r.job_id, r.attempt, r.gpu_seconds, r.billed) for r in acct.rows] == [
            (job, None, 50.0, 100.0)
        ]
        assert acct.rows[0].state == "PENDING"  # no launcher ran it in this test
        filtered = await call(nats_url, "acct", AcctRequest(user="root", users=("bob",)), AcctReply)
        assert filtered.rows == ()

        text = await asyncio.to_thread(cli, tmp_path, nats_url, "share", "-A", "research")
        assert text.splitlines()[0].split() == list(SHARE_COLUMNS)
        assert [line.split()[:2] for line in text.splitlines()[3:]] == [
            ["research", "70"],
            ["research", "alice"],
        ]
        raw = await asyncio.to_thread(cli, tmp_path, nats_url, "acct", "-j", str(job), "--json")
        assert msgspec.json.decode(raw)["rows"][0]["gpu_seconds"] == 50.0
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


async def _call(url: str, verb: str, req: msgspec.Struct, kind: type[T]) -> T | None:
    with contextlib.suppress(Exception):  # not subscribed yet: no responders
        return await call(url, verb, req, kind, timeout=2)
    return None


# --- the real cluster -------------------------------------------------------------------

LONG = "#!/bin/bash\nsleep 9\n"


@pytest.mark.slow
async def test_a_killed_fairshare_service_charges_exactly_the_launchers_gpu_seconds(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    cluster: Cluster = make_cluster(tmp_path / "state", nats_url, database_url)
    cluster.start_services()
    for node in nodes(2):
        cluster.start_node(node)
    try:
        await nodes_up(db, 2)
        reply = await submit(nats_url, LONG, ("--gpus-per-node=2",), workdir=str(tmp_path))
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", what="running")
        for _ in range(2):  # ticks flow every second; kill the consumer mid-stream
            await eventually(
                lambda: db.fetchval(
                    "SELECT coalesce(sum(charged), 0) FROM usage_charges WHERE job_id = $1",
                    job_id,
                ),
                lambda v: v > 0,
                what="a tick charged",
            )
            kill9(cluster, "fairshare")
            await asyncio.sleep(1.5)
            cluster.spawn("fairshare", "services.fairshare", MUSTER_INSTANCE="0")
            await asyncio.sleep(1.0)
        await eventually(
            lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 60, "job completes"
        )
        charged = await eventually(
            lambda: db.fetchrow(
                "SELECT sum(charged) AS charged, bool_and(settled) AS settled"
                " FROM usage_charges WHERE job_id = $1",
                job_id,
            ),
            lambda r: r is not None and bool(r["settled"]),
            30,
            "settlement charged",
        )
        assert charged is not None
        launcher = await db.fetchval("SELECT gpu_seconds FROM job_runs WHERE job_id = $1", job_id)
        assert launcher > 2 * 9 * 0.9
        assert charged["charged"] == launcher  # exactly, not approximately
        used = await db.fetchval("SELECT gpu_seconds FROM usage WHERE user_name = 'root'")
        assert used == pytest.approx(launcher, abs=1e-6)  # the sum of the differences
    finally:
        cluster.stop_all(timeout=10)


def at(offset_s: float) -> datetime:
    return datetime.fromtimestamp(T0 + offset_s, UTC)


async def test_report_sums_the_hours_of_a_window_per_account_and_user(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection, nats_url: str, tmp_path: Path
) -> None:
    """alice's job is charged an hour in the noon hour and another in the next; dave's
    half an hour at noon. Each charge lands in its tick's hour (`usage_hours`), so a
    window counts the hours it covers; alice sees every account's total and her own
    row, never dave's (usage is private by default); root sees all."""
    fs = FairShare(ctx, FairShareConfig(), CLUSTER, clock=lambda: T0 + 3 * 3600)
    await fs.handle(tick(801, 3600.0, occurred_at=at(600)))
    await fs.handle(tick(801, 7200.0, occurred_at=at(4200)))
    await fs.handle(tick(802, 1800.0, user="dave", occurred_at=at(1200)))
    assert await db.fetchval("SELECT count(*) FROM usage_hours") == 3
    stop = asyncio.Event()
    task = asyncio.create_task(fs.run(stop))

    def ask(user: str, since: float, until: float) -> Awaitable[ReportReply | None]:
        return _call(
            nats_url, "report", ReportRequest(user=user, since=since, until=until), ReportReply
        )

    def rows(reply: ReportReply | None) -> list[tuple[str, str | None, float, float]]:
        assert reply is not None
        return [(r.account, r.user, r.gpu_seconds, r.billed) for r in reply.rows]

    try:
        both = await eventually(
            lambda: ask("root", T0, T0 + 7200), lambda r: r is not None, what="a report"
        )
        assert rows(both) == [
            ("prod", None, 1800.0, 3600.0),  # H100: billed twice
            ("prod", "dave", 1800.0, 3600.0),
            ("research", None, 7200.0, 14400.0),
            ("research", "alice", 7200.0, 14400.0),
        ]
        assert both is not None and (both.since, both.until) == (T0, T0 + 7200)
        second = await ask("root", T0 + 3600, T0 + 5400)  # rounded up to 14:00
        assert rows(second) == [
            ("research", None, 3600.0, 7200.0),
            ("research", "alice", 3600.0, 7200.0),
        ]
        assert [r.user for r in rows_of(await ask("alice", T0, T0 + 7200))] == [
            None,
            None,
            "alice",
        ]
        with pytest.raises(ApiRefused, match="give an end"):
            await call(
                nats_url, "report", ReportRequest(user="root", since=T0, until=T0 - 7200),
                ReportReply,
            )  # fmt: skip
        text = await asyncio.to_thread(
            cli, tmp_path, nats_url, "report", "-S", str(T0), "-E", str(T0 + 7200),
            "-t", "minutes", "--accounts-only",
        )  # fmt: skip
        assert text.splitlines()[3:] == [
            "prod                30.00          60.00 20.00%",
            "research           120.00         240.00 80.00%",
        ]
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


NESTED = ClusterView(
    tree=AccountTree(
        accounts=(
            Account(name="research", shares=70),
            Account(name="nlp", parent="research", shares=1),
            Account(name="prod", shares=30),
        ),
        users=(
            UserAssoc(user="alice", account="research"),
            UserAssoc(user="erin", account="nlp"),
            UserAssoc(user="dave", account="prod"),
        ),
    ),
)


async def test_a_report_counts_sub_accounts_in_their_parents_row(
    ctx: ServiceContext[FairShareSettings], db: asyncpg.Connection, nats_url: str
) -> None:
    """research's row takes in its sub-account nlp, listed after research's users; a
    report for research (`-A research`) takes nlp in too; one for nlp shows nlp alone."""
    fs = FairShare(ctx, FairShareConfig(), NESTED, clock=lambda: T0 + 3 * 3600)
    await fs.handle(tick(811, 3600.0, occurred_at=at(600)))
    await fs.handle(tick(812, 1800.0, user="erin", account="nlp", occurred_at=at(900)))
    await fs.handle(tick(813, 900.0, user="dave", occurred_at=at(1200)))
    stop = asyncio.Event()
    task = asyncio.create_task(fs.run(stop))

    def ask(*accounts: str) -> Awaitable[ReportReply | None]:
        req = ReportRequest(user="root", since=T0, until=T0 + 3600, accounts=accounts)
        return _call(nats_url, "report", req, ReportReply)

    def rows(reply: ReportReply | None) -> list[tuple[int, str, str | None, float]]:
        return [(r.depth, r.account, r.user, r.gpu_seconds) for r in rows_of(reply)]

    try:
        whole = await eventually(ask, lambda r: r is not None, what="a report")
        assert rows(whole) == [
            (1, "prod", None, 900.0),
            (1, "prod", "dave", 900.0),
            (1, "research", None, 5400.0),  # alice's hour and erin's half hour in nlp
            (1, "research", "alice", 3600.0),
            (2, "nlp", None, 1800.0),
            (2, "nlp", "erin", 1800.0),
        ]
        assert rows(await ask("research")) == rows(whole)[2:]
        assert rows(await ask("nlp")) == [(1, "nlp", None, 1800.0), (1, "nlp", "erin", 1800.0)]
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)


def rows_of(reply: ReportReply | None) -> tuple[ReportRow, ...]:
    assert reply is not None
    return reply.rows
