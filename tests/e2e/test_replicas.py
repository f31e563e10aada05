"""End to end: health, admission and fairshare at two replicas each (real processes
on real NATS and PostgreSQL). One health replica judges liveness at a time (a lease
with a fencing epoch); killed, the other goes on judging: a silenced node still goes
DOWN, a live one never does. Replicas that start together all keep running (their
policy publishes are serialised), and usage is charged once by two fairshares. An
admission replica paused inside a command's transaction lets the rows it locked go
within seconds (the pool's idle-in-transaction limit)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import nats.errors
import pytest

from muster.client import ApiRefused, call
from muster.cluster import Cluster
from services.admission import repo as admission_repo
from services.admission.config import load_config
from shared.api import JobSelector, Ok
from shared.bus import STREAM, Bus
from tests.e2e.test_supervision import TOPOLOGY, cli, pids, processes_of, submitted
from tests.support.cluster import (
    IDENTITY_CONFIG,
    eventually,
    job_state,
    kill9,
    nodes,
    running_cluster,
    settled_usage,
    submit,
)

pytestmark = pytest.mark.slow

TWO = {"health": 2, "admission": 2, "fairshare": 2}
GPUS = 3 * 4  # nodes(3)
COUNTED = "SELECT coalesce(sum(gpu_seconds), 0) FROM cluster_hours"
# A configuration with a partition, so each admission replica writes policy rows.
POLICY = IDENTITY_CONFIG + (
    '[cluster]\nname = "t"\ndefault_partition = "normal"\n'
    '[partitions.normal]\nnodes = ["node[01-03]"]\nmax_time = "1:00:00"\n'
)


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    config = tmp_path / "cluster.toml"
    config.write_text(POLICY)
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(3),
        replicas=TWO,
        env={"MUSTER_CLUSTER_CONFIG": str(config)},
    ) as c:
        yield c


async def health_lease(db: asyncpg.Connection) -> tuple[str, int] | None:
    row = await db.fetchrow("SELECT holder, epoch FROM health_lease WHERE id = 1")
    return None if row is None else (row["holder"], row["epoch"])


def key_of(holder: str) -> str:
    """The process key of a lease holder (`health-<instance>-<nonce>`)."""
    instance = holder.split("-")[1]
    return "health" if instance == "0" else f"health-{instance}"


async def states(db: asyncpg.Connection) -> dict[str, str]:
    return {r["name"]: r["state"] for r in await db.fetch("SELECT name, state FROM nodes")}


async def watch_down(db: asyncpg.Connection, silenced: str, live: list[str]) -> list[str]:
    """Poll until `silenced` is DOWN; returns every live node seen DOWN on the way."""
    seen: list[str] = []
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        now = await states(db)
        seen += [n for n in live if now.get(n) == "DOWN"]
        if now.get(silenced) == "DOWN":
            return seen
        await asyncio.sleep(0.2)
    raise AssertionError(f"{silenced} never went DOWN; states {await states(db)}")


async def test_a_killed_health_judge_is_replaced_and_nodes_are_still_judged(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = await eventually(lambda: health_lease(db), lambda r: r is not None, 30, "a judge")
    assert first is not None
    kill9(cluster, key_of(first[0]))
    second = await eventually(
        lambda: health_lease(db), lambda r: r is not None and r[1] > first[1], 30, "a new judge"
    )
    assert second is not None and key_of(second[0]) != key_of(first[0])

    kill9(cluster, "node-node03")  # silenced: no heartbeat from now on
    assert await watch_down(db, "node03", ["node01", "node02"]) == []
    downs = await db.fetch(
        "SELECT convert_from(payload, 'UTF8') AS body FROM outbox"
        " WHERE subject = 'muster.node.down'"
    )
    assert [r["body"] for r in downs if '"node03"' not in r["body"]] == []
    assert len(downs) == 1  # one judge: declared DOWN once


async def test_a_paused_health_judge_resumed_after_a_takeover_judges_nothing(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    first = await eventually(lambda: health_lease(db), lambda r: r is not None, 30, "a judge")
    assert first is not None
    old_key = key_of(first[0])
    began, before = time.monotonic(), await db.fetchval(COUNTED)
    os.kill(cluster.pids[old_key], signal.SIGSTOP)
    try:
        await eventually(
            lambda: health_lease(db), lambda r: r is not None and r[1] > first[1], 30, "takeover"
        )
        unjudged = time.monotonic() - began  # no pass counted GPU time while no one judged
        kill9(cluster, "node-node03")
        assert await watch_down(db, "node03", ["node01", "node02"]) == []
    finally:
        os.kill(cluster.pids[old_key], signal.SIGCONT)
    log = cluster.state_dir / "logs" / f"{old_key}.log"
    await eventually(
        lambda: asyncio.to_thread(log.read_text),
        lambda text: "lost the health lease" in text,
        30,
        "the resumed judge notices it lost",
    )
    await asyncio.sleep(3)  # a few of its passes, had it gone on judging
    text = log.read_text()
    assert "node node_down" not in text and "node node_suspect" not in text
    assert (await states(db))["node01"] == "UP"
    # The GPUs' time (muster report --cluster) was counted once a second by one judge:
    # the resumed one counted nothing twice, and only the takeover went uncounted.
    counted, elapsed = await db.fetchval(COUNTED) - before, time.monotonic() - began
    assert GPUS * (elapsed - unjudged - 4) <= counted <= GPUS * (elapsed + 4), (
        counted,
        elapsed,
        unjudged,
    )


async def test_two_of_each_start_together_and_charge_usage_once(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    reply = await submit(
        cluster.nats_url, "#!/bin/bash\nsleep 3\n", ("--gpus-per-node=2",), str(tmp_path)
    )
    job = reply.job_ids[0]
    await eventually(lambda: job_state(db, job), lambda s: s == "COMPLETED", 60, "the job ends")
    used = await db.fetchval("SELECT gpu_seconds FROM job_runs WHERE job_id = $1", job)
    charged = await settled_usage(db, job)
    assert charged == pytest.approx(used)  # two fairshares, every tick charged once
    for key in ("admission", "admission-1", "fairshare", "fairshare-1", "health", "health-1"):
        assert cluster.procs[key].poll() is None, f"{key} exited; see its log"
    assert await db.fetchval("SELECT count(*) FROM partition_policy") == 1


async def test_policy_publishes_that_overlap_are_serialised(database_url: str) -> None:
    """Two admissions publishing at once (both start, or both reload one file): the
    second waits for the first and replaces its rows, where it used to fail on the
    partition's primary key and end the replica."""
    config = load_config(POLICY)
    a, b = await asyncpg.connect(database_url), await asyncpg.connect(database_url)
    try:
        ta, tb = a.transaction(), b.transaction()
        await ta.start()
        await tb.start()
        await admission_repo.publish_policy(a, config)
        second = asyncio.create_task(admission_repo.publish_policy(b, config))
        await asyncio.sleep(0.5)
        assert not second.done()  # waiting for the first publish, not racing it
        await ta.commit()
        await asyncio.wait_for(second, timeout=10)
        await tb.commit()
        assert await a.fetchval("SELECT count(*) FROM partition_policy") == 1
    finally:
        await a.close()
        await b.close()


async def test_up_with_replicas_on_three_nats_servers_survives_losing_one(
    tmp_path: Path,
) -> None:
    """`muster up --replicas 2 --nats-servers 3`: every replica and server is in
    cluster.json, the streams are kept on all three servers, a job runs, one server
    killed, the next job runs too and the supervisor starts the server again, and
    `muster down` leaves no process behind."""
    root = Path(tempfile.mkdtemp(prefix="muster-ha-"))  # see test_supervision's `up`
    state = root / "state"
    state.mkdir()
    topology = root / "topology.toml"
    topology.write_text(TOPOLOGY)
    try:
        started = await asyncio.to_thread(
            cli, state, "up", "--topology", str(topology), "--wait", "120",
            "--replicas", "2", "--nats-servers", "3",
        )  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        found = pids(state)
        want = {f"server-nats-{i}" for i in range(3)} | {"supervisor"}
        want |= {
            f"{s}{i}"
            for s in ("admission", "placer", "launcher", "health", "fairshare")
            for i in ("", "-1")
        }
        assert want <= set(found)
        data = json.loads((state / "cluster.json").read_text())
        assert await stream_replicas(data["nats_url"], state) == 3

        await asyncio.to_thread(completed, state, data["database_url"])
        os.kill(found["server-nats-0"], signal.SIGKILL)
        await asyncio.to_thread(completed, state, data["database_url"])
        again = await eventually(
            lambda: asyncio.to_thread(pids, state),
            lambda p: p["server-nats-0"] != found["server-nats-0"],
            30,
            "the supervisor restarts the killed NATS server",
        )
        os.kill(again["server-nats-0"], 0)  # alive, on its old config and store
    finally:
        if (state / "cluster.json").exists():
            stopped = await asyncio.to_thread(cli, state, "down")
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        left = await eventually(
            lambda: asyncio.to_thread(processes_of, state), lambda p: not p, 15, "nothing left"
        )
        shutil.rmtree(root, ignore_errors=True)
    assert left == []


async def stream_replicas(url: str, state: Path) -> int:
    admin = state / "secrets" / "nats-admin.nk"  # muster up secures the bus
    bus = await Bus.connect(url, name="replicas-test", creds=str(admin) if admin.exists() else "")
    try:
        return (await bus.js.stream_info(STREAM)).config.num_replicas or 1
    finally:
        await bus.close()


def completed(state: Path, database_url: str) -> None:
    job = submitted(state, "--nodes=2", "--wrap", "echo hi")

    async def wait() -> None:
        db = await asyncpg.connect(database_url)
        try:
            await eventually(
                lambda: db.fetchval("SELECT state FROM job_runs WHERE job_id = $1", job),
                lambda s: s == "COMPLETED",
                90,
                f"job {job} completes",
            )
        finally:
            await db.close()

    asyncio.run(wait())


# The admission replica (by its pool's application_name) whose transaction sits between
# two statements with a job's row locked
LOCKING_JOBS = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.relation = 'jobs'::regclass AND l.granted AND a.state = 'idle in transaction'"
    " AND a.application_name LIKE 'muster-admission-%' LIMIT 1"
)


async def toggle_hold(url: str, job_id: int) -> None:
    """Hold and release `job_id` again and again: each locks its row in a transaction."""
    for verb in itertools.cycle(("hold", "release")):
        with contextlib.suppress(ApiRefused, TimeoutError, nats.errors.Error):
            await call(url, verb, JobSelector(user="root", job_ids=(job_id,)), Ok, timeout=2)


async def row_free_after(db: asyncpg.Connection, job_id: int, within_s: float = 90) -> float:
    """Seconds until `job_id`'s row can be locked at once (NOWAIT)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    while True:
        try:
            async with db.transaction():
                await db.execute("SELECT 1 FROM jobs WHERE job_id = $1 FOR UPDATE NOWAIT", job_id)
            return loop.time() - began
        except asyncpg.LockNotAvailableError:
            assert loop.time() - began < within_s, "the row stayed locked"
            await asyncio.sleep(0.2)


async def test_an_admission_replica_paused_mid_command_lets_its_rows_go_within_seconds(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    """A replica SIGSTOPped between two statements of a hold keeps the job's row locked,
    and the placer, the launcher and the other replica wait on it, until PostgreSQL
    ends its idle transaction: 10 s now, a minute before."""
    job = (await submit(cluster.nats_url, "#!/bin/bash\nsleep 600\n")).job_ids[0]
    toggling = asyncio.create_task(toggle_hold(cluster.nats_url, job))
    key = ""
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while not key:
            assert asyncio.get_running_loop().time() < deadline, "no command caught"
            name = await db.fetchval(LOCKING_JOBS)
            if name is None:
                continue
            instance = name.rsplit("-", 1)[1]
            candidate = "admission" if instance == "0" else f"admission-{instance}"
            os.kill(cluster.pids[candidate], signal.SIGSTOP)
            await asyncio.sleep(0.3)
            if await db.fetchval(LOCKING_JOBS) == name:
                key = candidate
            else:
                os.kill(cluster.pids[candidate], signal.SIGCONT)
        toggling.cancel()
        held_s = await row_free_after(db, job)
    finally:
        toggling.cancel()
        if key:
            os.kill(cluster.pids[key], signal.SIGCONT)
    assert held_s < 30, f"the paused replica held the job's row {held_s:.1f} s"
    await call(cluster.nats_url, "cancel", JobSelector(user="root", job_ids=(job,)), Ok)
    await eventually(
        lambda: job_state(db, job),
        lambda s: s == "CANCELLED",
        60,
        "the job cancelled once the replica resumed",
    )
