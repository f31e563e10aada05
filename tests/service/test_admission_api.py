"""Admission's shell on real NATS and PostgreSQL: the service runs in-process with the
local cluster's configuration against four registered 4-GPU nodes; every command and
every refusal goes through a real request-reply round trip."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from muster.client import ApiRefused, call
from services.admission.service import Admission
from shared.api import (
    JobSelector,
    NodeAction,
    NodesReply,
    Ok,
    QueueReply,
    QueueRequest,
    ReloadReply,
    Request,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
    UpdateRequest,
)
from shared.events import JobLimitChanged, JobSubmitted, decode
from shared.runtime import service_context
from shared.settings import AdmissionSettings
from tests.support.cluster import use_test_keys

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "#!/bin/bash\nsleep 1\n"


class Api:
    def __init__(self, url: str, config: Path) -> None:
        self.url = url
        self.config = config

    async def submit(self, user: str, *argv: str, script: str = SCRIPT) -> SubmitReply:
        req = SubmitRequest(user=user, argv=argv, script=script, script_path="job.sh")
        return await call(self.url, "submit", req, SubmitReply)

    async def act(self, verb: str, user: str, *refs: str, **kw: Any) -> Ok:
        return await call(self.url, verb, JobSelector(user=user, job_refs=refs, **kw), Ok)

    async def queue(self, user: str = "root", **kw: Any) -> QueueReply:
        """As an operator by default: users see only their own jobs (private_data)."""
        return await call(self.url, "queue", QueueRequest(user=user, **kw), QueueReply)

    async def show(self, job_id: int, user: str = "alice") -> ShowJobReply:
        req = ShowJobRequest(user=user, job_id=job_id)
        return await call(self.url, "show", req, ShowJobReply)

    async def state(self, job_id: int) -> tuple[str, str]:
        job = (await self.queue(job_refs=(str(job_id),))).jobs[0]
        return job.state, job.reason


async def _register_nodes(db: asyncpg.Connection) -> None:
    for i in range(1, 5):
        await db.execute("INSERT INTO nodes(name) VALUES ($1)", f"node{i:02d}")
        await db.executemany(
            "INSERT INTO gpus(node, idx, model) VALUES ($1, $2, 'SIM-H100')",
            [(f"node{i:02d}", g) for g in range(4)],
        )


@pytest.fixture
async def api(
    nats_url: str, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> AsyncIterator[Api]:
    await _register_nodes(db)
    config = tmp_path / "cluster.toml"
    shutil.copy(REPO / "deploy" / "local" / "cluster.toml", config)
    settings = AdmissionSettings(
        nats_url=nats_url,
        database_url=database_url,
        cluster_config=str(config),
        user_keys_dir=str(use_test_keys(tmp_path / "keys")),
        service_name="admission",
    )
    stop = asyncio.Event()
    async with service_context(settings) as ctx:
        task = asyncio.create_task(Admission(ctx).run(stop))
        client = Api(nats_url, config)
        for _ in range(50):
            try:
                await call(nats_url, "queue", QueueRequest(user="root"), QueueReply, timeout=1)
                break
            except Exception:
                await asyncio.sleep(0.1)
        yield client
        stop.set()
        await asyncio.wait_for(task, 10)


async def _refused(coro: object) -> ApiRefused:
    with pytest.raises(ApiRefused) as info:
        await coro  # type: ignore[misc]
    return info.value


# --- submit ----------------------------------------------------------------------------


async def test_an_accepted_job_gets_the_configured_defaults_and_its_event_is_published(
    api: Api, db: asyncpg.Connection
) -> None:
    reply = await api.submit("alice", "--gpus-per-node=2")
    (job_id,) = reply.job_ids
    row = await db.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    assert row is not None
    assert (row["partition"], row["account"], row["qos"], row["time_limit_s"]) == (
        "normal",
        "research",
        "normal",
        3600,
    )
    assert (row["tier"], row["preemptible"], row["grace_s"], row["min_runtime_s"]) == (
        10,
        True,
        120,
        600,
    )
    published = await _wait_published(db)
    assert published == 1


async def _wait_published(db: asyncpg.Connection) -> int:
    for _ in range(50):
        n = await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
        if n:
            return int(n)
        await asyncio.sleep(0.1)
    return 0


REFUSALS = {
    "an unknown partition names the partitions": (
        "alice",
        ("-p", "gpu"),
        "partitions: debug, normal, large, inference",
    ),
    "a time over the partition's maximum names it": (
        "alice",
        ("-p", "debug", "-t", "2:00:00"),
        "30:00",
    ),
    "an account the partition does not allow": (
        "alice",
        ("-p", "inference"),
        "allowed accounts: prod",
    ),
    "a user with no account on the cluster": ("mallory", (), "has no account"),
    "an account the user is not in": ("alice", ("-A", "prod"), "your accounts: research"),
    "more GPUs per node than any node has": ("alice", ("--gpus-per-node=8",), "has 4 GPU"),
    "more nodes than the partition has": ("alice", ("-N", "5"), "4 node(s)"),
    "a QOS that does not exist": ("alice", ("-q", "gold"), "QOS defined: high, normal, low"),
    "a negative nice from a non-operator": ("alice", ("--nice=-5",), "only an operator"),
    "a dependency on a job that does not exist": ("alice", ("-d", "afterok:999999"), "999999"),
    "an unparseable option": ("alice", ("--frobnicate",), "frobnicate"),
}


@pytest.mark.parametrize(("user", "argv", "says"), REFUSALS.values(), ids=REFUSALS.keys())
async def test_a_refused_submission_says_why_and_leaves_no_trace(
    api: Api, db: asyncpg.Connection, user: str, argv: tuple[str, ...], says: str
) -> None:
    err = await _refused(api.submit(user, *argv))
    assert says in str(err)
    assert await db.fetchval("SELECT count(*) FROM jobs") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


async def test_the_submit_limit_counts_queued_jobs_and_array_tasks(api: Api) -> None:
    text = api.config.read_text().replace(
        "max_submitted_jobs_per_user = 500", "max_submitted_jobs_per_user = 3"
    )
    api.config.write_text(text)
    await call(api.url, "reload", Request(user="root"), ReloadReply)
    await api.submit("alice", "--array=0-1")
    err = await _refused(api.submit("alice", "--array=0-1"))
    assert "already has 2 job(s)" in str(err) and "limit of 3" in str(err)
    assert (await api.submit("alice")).job_ids


async def test_the_submit_limit_counts_running_and_requeued_jobs_but_never_finished_ones(
    api: Api, db: asyncpg.Connection
) -> None:
    text = api.config.read_text().replace(
        "max_submitted_jobs_per_user = 500", "max_submitted_jobs_per_user = 3"
    )
    api.config.write_text(text)
    await call(api.url, "reload", Request(user="root"), ReloadReply)
    ids = [(await api.submit("alice")).job_ids[0] for _ in range(3)]
    await _refused(api.submit("alice"))
    # as the launcher leaves them: one runs, one is back in the queue, one has ended
    await db.execute(
        "INSERT INTO job_runs(job_id, state) VALUES ($1, 'RUNNING'), ($2, 'REQUEUED'),"
        " ($3, 'COMPLETED')",
        *ids,
    )
    assert (await api.submit("alice")).job_ids
    err = await _refused(api.submit("alice"))
    assert "already has 3 job(s)" in str(err)


# --- approval, hold, release ------------------------------------------------------------


async def test_a_job_needing_approval_waits_until_an_operator_approves_it(api: Api) -> None:
    reply = await api.submit("alice", "-p", "large")
    assert any("approval" in w for w in reply.warnings)
    job = str(reply.job_ids[0])
    assert await api.state(int(job)) == ("PENDING", "APPROVAL")
    assert "approval" in (await api.show(int(job))).why_pending

    err = await _refused(api.act("release", "alice", job))
    assert "waits for an operator's approval" in str(err)
    err = await _refused(api.act("approve", "carol", job))
    assert err.code == "forbidden" and "only an operator" in str(err)

    ok = await api.act("approve", "root", job)
    assert ok.job_ids == (int(job),)
    assert (await api.show(int(job))).approval == "approved by root"
    err = await _refused(api.act("approve", "root", job))
    assert "already approved" in str(err)


async def test_a_user_hold_is_lifted_by_its_owner_but_an_operator_hold_only_by_an_operator(
    api: Api,
) -> None:
    job = str((await api.submit("alice")).job_ids[0])
    await api.act("hold", "alice", job)
    assert await api.state(int(job)) == ("PENDING", "HELD")
    await api.act("release", "alice", job)
    assert (await api.state(int(job)))[1] != "HELD"

    await api.act("hold", "root", job, reason="maintenance")
    assert await api.state(int(job)) == ("PENDING", "HELD_ADMIN")
    err = await _refused(api.act("release", "alice", job))
    assert "only an operator may release it" in str(err)
    await api.act("release", "root", job)
    err = await _refused(api.act("release", "alice", job))
    assert "is not held" in str(err)


async def test_a_pending_jobs_limit_nice_name_and_comment_change_in_place(
    api: Api, db: asyncpg.Connection
) -> None:
    """`muster update` / scontrol update: the same job, its new values stored (spec and
    columns) and shown; raising the limit is an operator's; a finished job is refused."""
    job = (await api.submit("alice", "-H", "-t", "2:00:00", "-J", "old")).job_ids[0]
    submitted = await db.fetchval("SELECT submitted_at FROM jobs WHERE job_id = $1", job)
    change = UpdateRequest(
        user="alice", job_refs=(str(job),), time_limit_s=1800, nice=10, name="new", comment="c"
    )
    ok = await call(api.url, "update", change, Ok)
    assert ok.job_ids == (job,) and "time_limit_s=1800" in ok.message
    row = await db.fetchrow(
        "SELECT name, time_limit_s, submitted_at, spec->>'nice' AS nice,"
        " spec->>'comment' AS comment, spec->>'time_limit_s' AS spec_limit FROM jobs"
        " WHERE job_id = $1",
        job,
    )
    assert row is not None
    assert dict(row) == {
        "name": "new", "time_limit_s": 1800, "submitted_at": submitted, "nice": "10",
        "comment": "c", "spec_limit": "1800",
    }  # fmt: skip
    shown = await api.show(job)
    assert shown.job.name == "new" and shown.job.time_limit_s == 1800
    assert await api.state(job) == ("PENDING", "HELD")  # still held, same place

    raise_it = UpdateRequest(user="alice", job_refs=(str(job),), time_limit_s=3600)
    err = await _refused(call(api.url, "update", raise_it, Ok))
    assert err.code == "forbidden" and "only an operator may raise a time limit" in str(err)
    as_root = UpdateRequest(user="root", job_refs=(str(job),), time_limit_s=3600)
    await call(api.url, "update", as_root, Ok)
    assert await db.fetchval("SELECT time_limit_s FROM jobs WHERE job_id = $1", job) == 3600

    await api.act("cancel", "alice", str(job))
    await db.execute(
        "INSERT INTO job_runs(job_id, state, ended_at) VALUES ($1, 'CANCELLED', now())", job
    )
    err = await _refused(call(api.url, "update", change, Ok))
    assert f"job {job} is CANCELLED; only a pending or running job can be updated" in str(err)


async def test_a_running_jobs_new_limit_is_told_to_its_coordinator_not_the_queue(
    api: Api, db: asyncpg.Connection
) -> None:
    """A started job's limit changes in place too, and `job.limit_changed` is owed to
    the launcher (its timers re-armed there, tests/e2e/test_update_running.py); a name
    alone owes nothing, and a running job is not woken in the queue (`job.submitted`).
    A change of each job's own limit (`TimeLimit=-5`) is told as the limit it makes."""
    job = (await api.submit("alice", "-t", "2:00:00")).job_ids[0]
    await db.execute(
        "INSERT INTO job_runs(job_id, state, attempt, started_at) VALUES ($1, 'RUNNING', 1, now())",
        job,
    )
    before = await db.fetchval("SELECT coalesce(max(id), 0) FROM outbox")
    await call(api.url, "update", UpdateRequest(user="alice", job_refs=(str(job),), name="n"), Ok)
    lower = UpdateRequest(user="alice", job_refs=(str(job),), time_limit_s=600)
    assert (await call(api.url, "update", lower, Ok)).job_ids == (job,)
    less = UpdateRequest(user="alice", job_refs=(str(job),), time_limit_change_s=-300)
    await call(api.url, "update", less, Ok)
    rows = await db.fetch("SELECT subject, payload FROM outbox WHERE id > $1 ORDER BY id", before)
    assert [r["subject"] for r in rows] == ["muster.job.limit_changed"] * 2
    told = [decode(bytes(r["payload"])) for r in rows]
    assert told == [
        JobLimitChanged(
            job_id=job,
            time_limit_s=limit,
            by="alice",
            event_id=e.event_id,
            occurred_at=e.occurred_at,
        )
        for limit, e in zip((600, 300), told, strict=True)
    ]
    limits = await db.fetchrow(
        "SELECT time_limit_s, (spec->>'time_limit_s')::int AS spec FROM jobs WHERE job_id = $1",
        job,
    )
    assert limits is not None and (limits["time_limit_s"], limits["spec"]) == (300, 300)
    assert await api.state(job) == ("RUNNING", "")


async def test_a_pending_jobs_placement_changes_in_place_checked_as_a_submission(
    api: Api, db: asyncpg.Connection
) -> None:
    """Partition, nodes and GPUs (scontrol's Partition=, NumNodes=, Gres=) of a pending
    job: the same job, its spec, columns and policy those of the new partition, one
    change counted for the placer (`spec_version`); a move the submission checks would
    refuse is refused saying why, and a running job is skipped."""
    job = (await api.submit("alice", "-H", "-A", "research", "-t", "2:00:00")).job_ids[0]
    submitted = await db.fetchval("SELECT submitted_at FROM jobs WHERE job_id = $1", job)
    move = UpdateRequest(
        user="alice", job_refs=(str(job),), partition="large", nodes="2", gpus_per_node=4,
        time_limit_s=3600,
    )  # fmt: skip
    ok = await call(api.url, "update", move, Ok)
    assert ok.job_ids == (job,) and "partition=large" in ok.message, ok
    row = await db.fetchrow(
        "SELECT partition, nodes_min, nodes_max, gpus_per_node, time_limit_s, tier,"
        " needs_approval, spec_version, submitted_at, spec->>'partition' AS spec_partition,"
        " (spec->>'nodes_min')::int AS spec_nodes FROM jobs WHERE job_id = $1",
        job,
    )
    assert row is not None
    assert dict(row) == {
        "partition": "large", "nodes_min": 2, "nodes_max": 2, "gpus_per_node": 4,
        "time_limit_s": 3600, "tier": 10, "needs_approval": True, "spec_version": 1,
        "submitted_at": submitted, "spec_partition": "large", "spec_nodes": 2,
    }  # fmt: skip
    assert await api.state(job) == ("PENDING", "HELD")
    woken = await db.fetchval(
        "SELECT payload FROM outbox WHERE subject = 'muster.job.submitted' ORDER BY id DESC"
    )
    assert decode(bytes(woken)) == JobSubmitted(
        job_id=job, user="alice", account="research", partition="large",
        event_id=decode(bytes(woken)).event_id, occurred_at=decode(bytes(woken)).occurred_at,
    )  # fmt: skip

    serve = UpdateRequest(user="alice", job_refs=(str(job),), partition="inference")
    err = await _refused(call(api.url, "update", serve, Ok))
    assert err.code == "invalid" and f"job {job}: " in str(err), str(err)
    assert "account 'research' may not use partition 'inference'" in str(err), str(err)
    wide = UpdateRequest(user="alice", job_refs=(str(job),), gpus_per_node=8)
    assert "8" in str(await _refused(call(api.url, "update", wide, Ok)))
    assert await db.fetchval("SELECT spec_version FROM jobs WHERE job_id = $1", job) == 1

    running = (await api.submit("alice")).job_ids[0]
    await db.execute(
        "INSERT INTO job_runs(job_id, state, attempt, started_at) VALUES ($1, 'RUNNING', 1, now())",
        running,
    )
    moved = UpdateRequest(user="alice", job_refs=(str(running),), nodes="2")
    err = await _refused(call(api.url, "update", moved, Ok))
    assert err.code == "invalid_state" and "placed already" in str(err), str(err)


async def test_a_job_moved_to_another_qos_counts_against_its_submit_limit(
    api: Api, db: asyncpg.Connection
) -> None:
    """A move into a QOS is a submission there: the owner's jobs already under it, and
    those the same request moves before, count; a job staying in its QOS is not counted
    again (its partition changes at the limit)."""
    text = api.config.read_text().replace(
        "max_submitted_jobs_per_user = 100", "max_submitted_jobs_per_user = 2"
    )
    api.config.write_text(text)
    await call(api.url, "reload", Request(user="root"), ReloadReply)
    high = (await api.submit("alice", "-q", "high", "-H")).job_ids[0]
    held = [(await api.submit("alice", "-H")).job_ids[0] for _ in range(2)]

    both = UpdateRequest(user="alice", job_refs=tuple(map(str, held)), qos="high")
    err = await _refused(call(api.url, "update", both, Ok))
    assert err.code == "invalid" and f"job {held[1]}: user 'alice' already has 2" in str(err)
    assert f"job {held[0]}:" not in str(err) and "limit of 2" in str(err), str(err)
    qos = await db.fetch("SELECT qos FROM jobs WHERE job_id = ANY($1::bigint[])", held)
    assert {r["qos"] for r in qos} == {"normal"}  # refused whole: neither moved

    await call(
        api.url, "update", UpdateRequest(user="alice", job_refs=(str(held[0]),), qos="high"), Ok
    )
    err = await _refused(
        call(
            api.url, "update", UpdateRequest(user="alice", job_refs=(str(held[1]),), qos="high"), Ok
        )
    )
    assert "already has 2 job(s) queued or running under QOS 'high'" in str(err), str(err)
    for job in (high, held[0]):  # at the limit, a job inside it still changes
        await call(
            api.url, "update", UpdateRequest(user="alice", job_refs=(str(job),), nodes="2"), Ok
        )


async def test_a_job_moved_to_another_account_counts_there_and_is_news_under_it(
    api: Api, db: asyncpg.Connection
) -> None:
    """`Account=` of a pending job: the owner's other account, counted against the QOS's
    per-account submit limit there; the row, the spec and the placer's wake-up name it.
    `ReqNodeList=` is stored as the job's required nodes."""
    text = api.config.read_text().replace(
        "max_submitted_jobs_per_account = 2000", "max_submitted_jobs_per_account = 1"
    )
    api.config.write_text(text)
    await call(api.url, "reload", Request(user="root"), ReloadReply)
    daves = (await api.submit("dave", "-H")).job_ids[0]  # prod's one job
    job = (await api.submit("bob", "-H")).job_ids[0]  # research's
    to_prod = UpdateRequest(user="bob", job_refs=(str(job),), account="prod")
    err = await _refused(call(api.url, "update", to_prod, Ok))
    assert "account 'prod' already has 1 job(s) queued or running" in str(err), str(err)
    await api.act("cancel", "dave", str(daves))
    await call(api.url, "update", to_prod, Ok)
    row = await db.fetchrow(
        "SELECT account, spec->>'account' AS spec_account FROM jobs WHERE job_id = $1", job
    )
    assert row is not None and dict(row) == {"account": "prod", "spec_account": "prod"}
    woken = await db.fetchval(
        "SELECT payload FROM outbox WHERE subject = 'muster.job.submitted' ORDER BY id DESC"
    )
    news = decode(bytes(woken))
    assert isinstance(news, JobSubmitted) and news.account == "prod", news
    err = await _refused(
        call(api.url, "update", UpdateRequest(user="alice", job_refs=(str(job),), name="x"), Ok)
    )
    assert err.code == "forbidden", str(err)  # alice coordinates neither account

    pinned = UpdateRequest(user="bob", job_refs=(str(job),), nodelist="node0[3-4]", nodes="2")
    await call(api.url, "update", pinned, Ok)
    got = await db.fetchval("SELECT spec->'required_nodes' FROM jobs WHERE job_id = $1", job)
    assert json.loads(got) == ["node03", "node04"]
    wider = UpdateRequest(user="bob", job_refs=(str(job),), nodelist="node0[1-3]")
    err = await _refused(call(api.url, "update", wider, Ok))
    assert "--nodelist names 3 nodes but the job asks for at most 2" in str(err), str(err)


async def test_a_pending_jobs_start_time_and_dependency_change_in_place(
    api: Api, db: asyncpg.Connection
) -> None:
    """scontrol's StartTime= and Dependency= of a pending job: stored, counted for the
    placer; a dependency on a job that does not exist, or on the job itself, refused."""
    first = (await api.submit("alice", "-H")).job_ids[0]
    job = (await api.submit("alice", "-H")).job_ids[0]
    later = UpdateRequest(
        user="alice", job_refs=(str(job),), begin="now+1hour", dependency=f"afterok:{first}"
    )
    await call(api.url, "update", later, Ok)
    row = await db.fetchrow(
        "SELECT (spec->>'begin_at')::float8 - extract(epoch FROM now()) AS wait_s,"
        " spec->'dependencies' AS deps, spec_version FROM jobs WHERE job_id = $1",
        job,
    )
    assert row is not None and 3500 < row["wait_s"] <= 3600, row
    assert json.loads(row["deps"]) == [
        {"kind": "afterok", "job_ids": [first], "delay_s": 0, "tasks": []}
    ]
    assert row["spec_version"] == 1
    for dependency, said in (
        (f"afterok:{job}", "--dependency names the job itself"),
        ("afterok:999999", "--dependency names job(s) that do not exist: 999999"),
    ):
        bad = UpdateRequest(user="alice", job_refs=(str(job),), dependency=dependency)
        err = await _refused(call(api.url, "update", bad, Ok))
        assert err.code == "invalid" and said in str(err), str(err)
    cleared = UpdateRequest(user="alice", job_refs=(str(job),), dependency="")
    await call(api.url, "update", cleared, Ok)
    deps = await db.fetchval("SELECT spec->'dependencies' FROM jobs WHERE job_id = $1", job)
    assert json.loads(deps) == []


async def test_mine_selects_the_requesters_own_jobs(api: Api) -> None:
    """`squeue --me` / `scancel --me`: the signer's jobs, named by no client variable."""
    alices = (await api.submit("alice", "-H")).job_ids[0]
    bobs = (await api.submit("bob", "-H")).job_ids[0]
    mine = await api.queue("root", users=("root",), mine=True)
    assert mine.jobs == ()
    assert [j.job_id for j in (await api.queue("alice", mine=True)).jobs] == [alices]
    assert (await api.act("cancel", "bob", mine=True)).job_ids == (bobs,)
    assert await api.state(alices) == ("PENDING", "HELD")


async def test_a_dependency_on_an_array_task_names_that_tasks_job(
    api: Api, db: asyncpg.Connection
) -> None:
    """`afterok:12_1`: array 12's task 1, stored as the task's own job id (what the placer
    reads); a task the array does not have is refused by its name. Before, `12_1` was
    refused as "not a job id"."""
    array = (await api.submit("alice", "-H", "--array=0-2")).job_ids
    after = (await api.submit("alice", "-H", "-d", f"afterok:{array[0]}_1")).job_ids[0]
    deps = await db.fetchval("SELECT spec->'dependencies' FROM jobs WHERE job_id = $1", after)
    assert json.loads(deps) == [
        {"kind": "afterok", "job_ids": [array[1]], "delay_s": 0, "tasks": []}
    ]
    err = await _refused(api.submit("alice", "-d", f"afterok:{array[0]}_7"))
    assert f"names job(s) that do not exist: {array[0]}_7" in str(err), str(err)
    moved = UpdateRequest(user="alice", job_refs=(str(after),), dependency=f"afterany:{array[0]}_2")
    await call(api.url, "update", moved, Ok)
    deps = await db.fetchval("SELECT spec->'dependencies' FROM jobs WHERE job_id = $1", after)
    assert [d["job_ids"] for d in json.loads(deps)] == [[array[2]]]


async def test_a_job_submitted_held_is_released_by_its_owner(api: Api) -> None:
    job = (await api.submit("alice", "-H")).job_ids[0]
    assert await api.state(job) == ("PENDING", "HELD")
    await api.act("release", "alice", str(job))
    assert await api.state(job) != ("PENDING", "HELD")


# --- cancel -----------------------------------------------------------------------------


async def test_cancel_by_id_array_task_name_and_user(api: Api) -> None:
    single = (await api.submit("alice")).job_ids[0]
    array = (await api.submit("alice", "--array=0-4")).job_ids
    named = (await api.submit("bob", "-J", "sweep")).job_ids[0]
    other = (await api.submit("bob", "-J", "keep")).job_ids[0]

    assert (await api.act("cancel", "alice", str(single))).job_ids == (single,)
    ok = await api.act("cancel", "alice", f"{array[0]}_3")
    assert ok.job_ids == (array[3],)
    ok = await api.act("cancel", "alice", f"{array[0]}_[0-1]")
    assert ok.job_ids == array[:2]
    ok = await api.act("cancel", "bob", name="sweep")
    assert ok.job_ids == (named,)
    ok = await api.act("cancel", "alice", owner="alice")  # what is left of alice's array
    assert ok.job_ids == (array[2], array[4])
    states = {j.job_id: j.state for j in (await api.queue(all_states=True)).jobs}
    assert states[other] == "PENDING"
    assert all(states[j] == "CANCELLED" for j in (single, named, *array))

    err = await _refused(api.act("cancel", "alice", str(single)))
    assert "already ended (CANCELLED)" in str(err)


CANCEL_REFUSALS = {
    "another user's job": ("bob", "'bob' may not cancel a job of 'alice'"),
    "a coordinator of another account": ("dave", "only its owner, a coordinator"),
}


@pytest.mark.parametrize(("actor", "says"), CANCEL_REFUSALS.values(), ids=CANCEL_REFUSALS.keys())
async def test_cancelling_a_job_that_is_not_yours_is_refused_with_who_may(
    api: Api, actor: str, says: str
) -> None:
    job = str((await api.submit("alice")).job_ids[0])
    err = await _refused(api.act("cancel", actor, job))
    assert err.code == "forbidden"
    assert says in str(err)


async def test_a_coordinator_and_an_operator_may_cancel_a_job_of_their_account(api: Api) -> None:
    a = (await api.submit("alice")).job_ids[0]
    b = (await api.submit("alice")).job_ids[0]
    assert (await api.act("cancel", "carol", str(a))).job_ids == (a,)
    assert (await api.act("cancel", "root", str(b))).job_ids == (b,)


async def test_cancel_refusals_for_bad_selections(api: Api) -> None:
    assert "not a job id" in str(await _refused(api.act("cancel", "alice", "12x")))
    assert "no job matches" in str(await _refused(api.act("cancel", "alice", "424242")))
    assert "say which jobs" in str(await _refused(api.act("cancel", "alice")))
    job = str((await api.submit("alice")).job_ids[0])
    err = await _refused(api.act("cancel", "alice", job, signal="USR1"))
    assert "not running: no signal" in str(err)
    err = await _refused(api.act("cancel", "alice", job, signal="NOPE"))
    assert "unknown signal" in str(err)
    for code in (-1, 256):  # a release's status (salloc's) is a process's
        err = await _refused(api.act("cancel", "alice", job, exit_code=code))
        assert err.code == "invalid" and "0 to 255" in str(err)


# --- reads ------------------------------------------------------------------------------


async def test_queue_filters_by_user_partition_and_state(api: Api) -> None:
    a = (await api.submit("alice")).job_ids[0]
    b = (await api.submit("bob", "-p", "debug")).job_ids[0]
    c = (await api.submit("alice", "-H")).job_ids[0]

    def ids(r: QueueReply) -> list[int]:
        return [j.job_id for j in r.jobs]

    assert ids(await api.queue(users=("alice",))) == [a, c]
    assert ids(await api.queue(partitions=("debug",))) == [b]
    await api.act("cancel", "alice", str(a))
    assert ids(await api.queue()) == [b, c]
    assert ids(await api.queue(states=("CANCELLED",))) == [a]
    raw = msgspec.to_builtins((await api.queue()).jobs[0])
    assert {"job_id", "state", "reason", "partition", "estimated_start", "array_task_id"} <= set(
        raw
    )


async def test_show_hides_the_job_from_others_and_says_why_a_job_waits(api: Api) -> None:
    first = (await api.submit("alice")).job_ids[0]
    job = (await api.submit("alice", "-H", "-d", f"afterok:{first}")).job_ids[0]
    mine = await api.show(job, "alice")
    assert mine.spec["script"] == SCRIPT
    assert mine.dependency == f"afterok:{first}"
    assert mine.why_pending.startswith("HELD: it is held")
    assert "private" in str(await _refused(api.show(job, "dave")))  # jobs are private
    assert (await api.show(job, "carol")).spec["script"] == SCRIPT  # coordinator of research
    missing = str(await _refused(api.show(987654)))
    assert "no such job: 987654 (never submitted, or finished more than 365 days ago" in missing
    # a dependency on a job the database does not hold is refused (Slurm: "Job
    # dependency problem"), not taken as met
    refused = await _refused(api.submit("alice", "-d", "afterok:987654"))
    assert refused.code == "bad_dependency"
    assert "--dependency names job(s) that do not exist: 987654" in str(refused)
    assert "purged 365 days after its end" in str(refused)


# --- operators --------------------------------------------------------------------------


async def test_reload_is_for_operators_and_a_bad_file_keeps_the_old_configuration(
    api: Api,
) -> None:
    err = await _refused(call(api.url, "reload", Request(user="alice"), ReloadReply))
    assert err.code == "forbidden" and "only an operator" in str(err)

    good = api.config.read_text()
    api.config.write_text(good.replace('max_time = "30:00"', 'max_tme = "30:00"'))
    err = await _refused(call(api.url, "reload", Request(user="root"), ReloadReply))
    assert "unchanged" in str(err) and any("max_tme" in d for d in err.details)
    assert (await api.submit("alice", "-p", "debug")).job_ids  # old config still in force

    api.config.write_text(good + '\n[partitions.extra]\nnodes = ["gpu"]\n')
    reply = await call(api.url, "reload", Request(user="root"), ReloadReply)
    assert reply.changed and "extra" in reply.partitions
    assert (await api.submit("alice", "-p", "extra")).job_ids


async def test_drain_is_for_operators_and_names_the_nodes(api: Api) -> None:
    req = NodeAction(user="alice", node="node01", reason="fan")
    err = await _refused(call(api.url, "drain", req, Ok))
    assert "only an operator may drain" in str(err)
    req = NodeAction(user="root", node="node99", reason="fan")
    err = await _refused(call(api.url, "drain", req, Ok))
    assert "nodes are: node01" in str(err)
    assert "say why" in str(
        await _refused(call(api.url, "drain", NodeAction(user="root", node="node01"), Ok))
    )


async def test_concurrent_submissions_are_committed_together_each_with_its_event(
    api: Api, db: asyncpg.Connection
) -> None:
    replies = await asyncio.gather(*(api.submit(("alice", "bob")[i % 2]) for i in range(200)))
    ids = sorted(j for r in replies for j in r.job_ids)
    assert len(set(ids)) == 200
    stored = await db.fetch("SELECT job_id, user_name, spec FROM jobs ORDER BY job_id")
    assert [r["job_id"] for r in stored] == ids
    events = await db.fetchval("SELECT count(DISTINCT event_id) FROM outbox")
    assert events == 200


async def test_show_prints_the_priority_factors_fairshare_ranked_the_job_with(
    api: Api, db: asyncpg.Connection
) -> None:
    job = (await api.submit("alice", "-H")).job_ids[0]
    assert (await api.show(job)).priority == {}  # not ranked yet
    factors = (
        '{"total": 5100.0, "age": 100.0, "fairshare": 5000.0, "jobsize": 0.0,'
        ' "partition": 0.0, "qos": 0.0, "nice": 0.0, "factors": {"age": 0.1}}'
    )
    await db.execute(
        "INSERT INTO job_priorities(job_id, total, factors) VALUES ($1, 5100, $2::jsonb)",
        job,
        factors,
    )
    shown = (await api.show(job)).priority
    assert shown == {
        "total": 5100.0,
        "age": 100.0,
        "fairshare": 5000.0,
        "jobsize": 0.0,
        "partition": 0.0,
        "qos": 0.0,
        "nice": 0.0,
    }


async def test_the_placement_policy_of_the_config_is_published_for_the_placer(
    api: Api, db: asyncpg.Connection
) -> None:
    parts = {r["partition"]: r for r in await db.fetch("SELECT * FROM partition_policy")}
    assert set(parts) == {"debug", "normal", "large", "inference"}
    assert parts["debug"]["nodes"] == ["node04"] and parts["debug"]["tier"] == 100
    limits = {r["qos"]: r for r in await db.fetch("SELECT * FROM qos_limits")}
    assert limits["normal"]["max_gpus_per_user"] == 16
    assert limits["normal"]["max_jobs_per_user"] == 50


async def test_the_queue_gives_a_waiting_jobs_dependency_when_asked(
    api: Api, db: asyncpg.Connection
) -> None:
    """`squeue -o %E`: a job held back by its --dependency carries it, asked for; a job
    whose dependency is met (it waits on something else) shows none, as Slurm's."""
    first = (await api.submit("alice", "-H")).job_ids[0]
    waits = (await api.submit("alice", "-d", f"afterok:{first}")).job_ids[0]
    met = (await api.submit("alice", "-d", f"afterany:{first}")).job_ids[0]
    await db.executemany(  # as the placer records them
        "INSERT INTO pending_reasons (job_id, reason) VALUES ($1, $2)",
        [(waits, "DEPENDENCY"), (met, "PRIORITY")],
    )
    asked = await api.queue("alice", dependencies=True)
    assert {j.job_id: j.dependency for j in asked.jobs} == {
        first: "",
        waits: f"afterok:{first}",
        met: "",
    }
    plain = await api.queue("alice")
    assert {j.dependency for j in plain.jobs} == {""}  # not asked: no read more


async def test_an_arrays_ended_tasks_are_left_alone_without_a_word(api: Api) -> None:
    """`scontrol release 8` on an array whose task 0 ended: the others released, and no
    error line per ended task (a 1,000-task array printed one each); task 0 named alone
    is still refused with why."""
    ids = (await api.submit("alice", "-H", "--array=0-2")).job_ids
    await api.act("cancel", "alice", f"{ids[0]}_0")
    released = await api.act("release", "alice", str(ids[0]))
    assert (released.job_ids, released.skipped) == (ids[1:], ())
    err = await _refused(api.act("release", "alice", f"{ids[0]}_0"))
    assert "already ended" in str(err), str(err)


async def test_the_queue_gives_a_pending_jobs_priority_when_asked(
    api: Api, db: asyncpg.Connection
) -> None:
    """`sprio`: each pending job's priority and factors, as fairshare last ranked it."""
    ranked = (await api.submit("alice", "-H")).job_ids[0]
    fresh = (await api.submit("alice", "-H")).job_ids[0]
    await db.execute(  # as fairshare writes it
        "INSERT INTO job_priorities (job_id, total, factors) VALUES ($1, 130, $2::jsonb)",
        ranked,
        json.dumps({"total": 130.0, "age": 30.0, "fairshare": 100.0, "note": "x"}),
    )
    asked = await api.queue("alice", priorities=True)
    assert {j.job_id: j.priority for j in asked.jobs} == {
        ranked: {"total": 130.0, "age": 30.0, "fairshare": 100.0},
        fresh: {},
    }
    assert {j.job_id: j.priority for j in (await api.queue("alice")).jobs} == {
        ranked: {},
        fresh: {},
    }


async def test_an_array_tasks_view_carries_its_arrays_throttle(api: Api) -> None:
    """squeue's collapsed line says an array's `%K` (`8_[2-7%2]`), read from the spec."""
    ids = (await api.submit("alice", "-H", "--array=0-3%2")).job_ids
    plain = (await api.submit("alice", "-H")).job_ids[0]
    views = {j.job_id: j.array_max_running for j in (await api.queue("alice")).jobs}
    assert views == {**dict.fromkeys(ids, 2), plain: None}


async def test_the_nodes_reply_gives_each_partitions_limits_and_each_reservations_window(
    api: Api,
) -> None:
    """`scontrol show partition`, `scontrol show reservation`, `sinfo -T`: from the
    configuration in force, a weekly window at its next (or open) occurrence."""
    api.config.write_text(
        api.config.read_text() + "\n[reservations.patch]\nstart = 2026-12-01T02:00:00Z\n"
        'duration = "2:00:00"\nrecurrence = "weekly"\nmaintenance = true\n'
    )
    await call(api.url, "reload", Request(user="root"), ReloadReply)
    reply = await call(api.url, "nodes", QueueRequest(user="alice"), NodesReply)
    debug = next(v for v in reply.partition_views if v.name == "debug")
    assert (debug.max_nodes, debug.max_gpus_per_job) == (1, 4)
    [patch] = reply.reservations
    assert (patch.name, patch.maintenance, patch.recurrence) == ("patch", True, "weekly")
    assert patch.end - patch.start == 7200 and patch.end > time.time()
    assert (patch.start - 1_796_090_400) % 604_800 == 0  # weeks on from its first start


async def test_an_arrays_throttle_changes_on_each_of_its_tasks(
    api: Api, db: asyncpg.Connection
) -> None:
    """`scontrol update JobId=8 ArrayTaskThrottle=1`: every task's spec (what the placer
    counts) and view; an ended task is left without a word; 0 lifts it."""
    ids = (await api.submit("alice", "-H", "--array=0-2%2")).job_ids
    await api.act("cancel", "alice", f"{ids[0]}_2")

    async def throttles() -> dict[int, object]:
        rows = await db.fetch(
            "SELECT job_id, spec->'array_max_running' AS k FROM jobs"
            " WHERE job_id = ANY($1::bigint[])",
            list(ids),
        )
        return {r["job_id"]: json.loads(r["k"]) for r in rows}

    one = UpdateRequest(user="alice", job_refs=(str(ids[0]),), array_throttle=1)
    reply = await call(api.url, "update", one, Ok)
    assert (reply.job_ids, reply.skipped) == (ids[:2], ())
    assert await throttles() == {ids[0]: 1, ids[1]: 1, ids[2]: 2}  # the cancelled one kept
    lifted = UpdateRequest(user="alice", job_refs=(str(ids[0]),), array_throttle=0)
    await call(api.url, "update", lifted, Ok)
    assert [j.array_max_running for j in (await api.queue("alice")).jobs] == [None, None]
    plain = (await api.submit("alice", "-H")).job_ids[0]
    err = await _refused(
        call(api.url, "update", UpdateRequest(user="alice", job_refs=(str(plain),),
                                                array_throttle=2), Ok)
    )  # fmt: skip
    assert "is not an array task" in str(err), str(err)
