"""End to end, on real NATS, PostgreSQL and processes: the launcher's time limits,
`--signal`, preemption, gang-start failure, cancel of a forking script and run-as."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import msgspec
import pytest

from muster.client import agent, call
from muster.cluster import Cluster
from services.health.probe import NodeProbe
from services.health.sim_backend import SimulatedGpuBackend
from shared.api import AGENT_PREFIX, AgentReply, JobSelector, Ok, StopWorkers, WorkerSpec
from shared.bus import Bus
from shared.events import JobPreemptRequested, WorkerExited
from shared.identity_files import provision_keys
from tests.support.accounts import AccountUnavailable, run_as_account
from tests.support.cluster import (
    eventually,
    inject,
    job_state,
    make_cluster,
    nodes,
    nodes_up,
    publish_event,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILL_WAIT_S = 3.0  # MUSTER_KILL_WAIT_S in tests/support/cluster.py FAST

STUBBORN = """#!/bin/bash
trap 'echo "got TERM at $(date +%s.%N) restart=$MUSTER_RESTART_COUNT"' TERM
trap 'echo "got USR1 at $(date +%s.%N)"' USR1
ids="restart=$MUSTER_RESTART_COUNT attempt=$MUSTER_ATTEMPT gen=$MUSTER_GENERATION"
echo "start at $(date +%s.%N) $ids"
while true; do sleep 0.1; done
"""


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(2)) as c:
        yield c


async def run_row(db: asyncpg.Connection, job_id: int) -> asyncpg.Record | None:
    return await db.fetchrow(
        "SELECT state, reason, nodes, restart_count, excluded_nodes,"
        " extract(epoch FROM started_at)::float8 AS started,"
        " extract(epoch FROM ended_at)::float8 AS ended FROM job_runs WHERE job_id = $1",
        job_id,
    )


async def text_of(path: Path) -> str:
    return await asyncio.to_thread(lambda: path.read_text() if path.exists() else "")


def stamp(text: str, word: str) -> float:
    """The time printed on the first `word ... at <epoch>` line."""
    line = next(ln for ln in text.splitlines() if ln.startswith(word))
    return float(line.split(" at ")[1].split()[0])


async def test_the_time_limit_sends_sigterm_then_sigkill_after_the_kill_wait_and_ends_in_timeout(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    reply = await submit(cluster.nats_url, STUBBORN, ("--time=0:03",), workdir=str(tmp_path))
    job_id = reply.job_ids[0]
    out = tmp_path / f"slurm-{job_id}.out"

    row = await eventually(
        lambda: run_row(db, job_id), lambda r: r is not None and r["state"] == "TIMEOUT", 40
    )
    assert row is not None
    text = out.read_text()
    started, termed = stamp(text, "start"), stamp(text, "got TERM")
    # SIGTERM at the 3 s limit, not before (the bound above is loose: a busy machine
    # may deliver late, and speed is the benchmarks' business, not the tests')
    assert 2.5 <= termed - started <= 15.0, text
    # It ignored SIGTERM, so only the SIGKILL after MUSTER_KILL_WAIT_S ended it.
    assert row["ended"] - termed >= KILL_WAIT_S - 0.5
    assert "time limit" in row["reason"]


async def test_signal_is_delivered_that_long_before_the_time_limit(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    argv = ("--time=0:06", "--signal=USR1@4")
    reply = await submit(cluster.nats_url, STUBBORN, argv, workdir=str(tmp_path))
    job_id = reply.job_ids[0]
    out = tmp_path / f"slurm-{job_id}.out"

    await eventually(lambda: job_state(db, job_id), lambda s: s == "TIMEOUT", 40, "timeout")
    text = out.read_text()
    started, usr1, termed = stamp(text, "start"), stamp(text, "got USR1"), stamp(text, "got TERM")
    assert usr1 - started >= 1.5, text  # 6 s limit - 4 s, not earlier
    assert termed - usr1 >= 3.0, text  # and it came well before the limit's SIGTERM
    assert termed - started <= 20.0, text


async def preempt(url: str, job_id: int, grace_s: int) -> None:
    """What the placer emits for a victim (published as the outbox relay would)."""
    await publish_event(
        url, JobPreemptRequested(job_id=job_id, for_job_id=0, grace_s=grace_s, epoch=0)
    )


async def test_a_preempted_job_gets_sigterm_and_its_grace_then_is_requeued_with_the_same_id(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    reply = await submit(cluster.nats_url, STUBBORN, ("--gpus-per-node=4",), workdir=str(tmp_path))
    job_id = reply.job_ids[0]
    out = tmp_path / f"slurm-{job_id}.out"
    await eventually(lambda: text_of(out), lambda t: "start" in t, 30, "running")

    await preempt(cluster.nats_url, job_id, grace_s=2)

    text = await eventually(lambda: text_of(out), lambda t: "restart=1" in t, 40, "restarted")
    row = await run_row(db, job_id)
    assert row is not None and row["restart_count"] == 1
    termed = stamp(text, "got TERM")
    restarted = float(text.split("start at ")[2].split()[0])
    assert restarted - termed >= 2.0 - 0.2, text  # the grace was given before the kill
    assert "got TERM at" in text and "restart=0" in text
    # A requeue is a new allocation (attempt 2) and the next generation of the job.
    assert "restart=0 attempt=1 gen=0" in text and "restart=1 attempt=2 gen=1" in text, text
    # The second attempt's row is written once every agent answered its start, which
    # may be after the worker's first line.
    history = await eventually(
        lambda: db.fetch(
            "SELECT seq, outcome FROM attempts WHERE job_id = $1 ORDER BY attempt, seq", job_id
        ),
        lambda h: len(h) >= 2,
        30,
        "the second attempt's row",
    )
    assert [h["seq"] for h in history] == [0, 1]
    assert "preempted" in history[0]["outcome"]


async def test_a_preempted_job_that_may_not_be_requeued_ends_preempted(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    reply = await submit(cluster.nats_url, STUBBORN, ("--no-requeue",), workdir=str(tmp_path))
    job_id = reply.job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 30, "running")

    await preempt(cluster.nats_url, job_id, grace_s=1)

    await eventually(lambda: job_state(db, job_id), lambda s: s == "PREEMPTED", 30, "preempted")


StartAnswer = Callable[[Bus, WorkerSpec], Awaitable[AgentReply]]


async def refuse_start(_bus: Bus, _spec: WorkerSpec) -> AgentReply:
    return AgentReply(ok=False, message="the spool is not writable")


@contextlib.asynccontextmanager
async def ghost_node(url: str, name: str, start: StartAnswer = refuse_start) -> AsyncIterator[None]:
    """A node whose health probe registers and heartbeats but whose agent answers a
    start with `start` (by default a refusal, as a node whose spool or accounts are
    broken answers); it names a port and answers stops. A node that does not answer at
    all is not excluded (the table tests of the coordinator's core)."""
    bus = await Bus.connect(url, name=f"ghost-{name}")
    await bus.ensure_streams()

    async def answer(payload: bytes, subject: str) -> bytes:
        verb = subject.rsplit(".", 1)[-1]
        if verb == "start":
            spec = msgspec.json.decode(payload, type=WorkerSpec)
            return msgspec.json.encode(await start(bus, spec))
        return msgspec.json.encode(AgentReply(ok=True, port=29500 if verb == "port" else 0))

    await bus.serve(f"{AGENT_PREFIX}{name}.*", f"ghost-{name}", answer)
    backend = SimulatedGpuBackend(name, gpu_count=4, model="SIM-H100")
    probe = NodeProbe(
        bus, backend, node=name, address="127.0.0.1", topology=("spine0", "leaf1"),
        heartbeat_s=1.0, expected_gpus=4,
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        backend.close()
        await bus.close()


async def test_a_gang_that_cannot_start_on_one_node_is_requeued_without_it_and_leaves_no_worker(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    c = make_cluster(tmp_path / "state", nats_url, database_url)
    c.start_services()
    c.start_node(nodes(1)[0])
    try:
        await nodes_up(db, 1)
        async with ghost_node(nats_url, "ghost"):
            await nodes_up(db, 2)
            argv = ("--nodes=2", "--gpus-per-node=4")
            reply = await submit(nats_url, STUBBORN, argv, workdir=str(tmp_path))
            job_id = reply.job_ids[0]

            row = await eventually(
                lambda: run_row(db, job_id),
                lambda r: r is not None and r["state"] == "REQUEUED",
                30,
                "requeued",
            )
            assert row is not None
            assert row["excluded_nodes"] == ["ghost"] and row["restart_count"] == 1
            assert "could not start on ghost" in row["reason"]
            # The worker that did start on node01 was stopped: no partial gang remains.
            status = await eventually(
                lambda: _agent_status(nats_url, "node01"), lambda r: not r.workers, 15
            )
            assert status.workers == ()
            assert not _processes_of_job(job_id, tmp_path)
            outcome = await db.fetchval("SELECT outcome FROM attempts WHERE job_id = $1", job_id)
            assert "could not start on ghost" in outcome
    finally:
        c.stop_all(timeout=10)


async def test_a_worker_that_exits_before_its_start_is_recorded_still_started_the_run(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """A quick script's exit can reach the launcher before the agent's answer to the
    start does. The ghost agent makes that order certain: it reports the exit, waits
    until the launcher has decided it, and only then answers the start. The run still
    records its start (the column sacct and the runtime predictions read) and its use."""
    other = await asyncpg.connect(database_url)

    async def exit_first(bus: Bus, spec: WorkerSpec) -> AgentReply:
        await bus.publish(
            WorkerExited(
                job_id=spec.job_id, attempt=spec.attempt, node="ghost", exit_code=0,
                generation=spec.generation,
            )
        )  # fmt: skip
        await eventually(lambda: job_state(other, spec.job_id), lambda s: s == "COMPLETED", 20)
        return AgentReply(ok=True)

    c = make_cluster(tmp_path / "state", nats_url, database_url)
    c.start_services()
    try:
        async with ghost_node(nats_url, "ghost", start=exit_first):
            await nodes_up(db, 1)
            argv = ("--gpus-per-node=1",)
            reply = await submit(nats_url, "#!/bin/bash\ntrue\n", argv, workdir=str(tmp_path))
            job_id = reply.job_ids[0]
            await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 30)
            row = await db.fetchrow(
                "SELECT started_at, ended_at, gpu_seconds FROM job_runs WHERE job_id = $1",
                job_id,
            )
            assert row is not None
            assert row["started_at"] is not None and row["started_at"] <= row["ended_at"]
            assert row["gpu_seconds"] > 0, dict(row)  # charged from the start it recorded
            attempt = await db.fetchrow(
                "SELECT started_at, outcome FROM attempts WHERE job_id = $1", job_id
            )
            assert attempt is not None
            assert attempt["started_at"] == row["started_at"], attempt
            assert attempt["outcome"].startswith("complete"), attempt
    finally:
        c.stop_all(timeout=10)
        await other.close()


async def _agent_status(url: str, node: str) -> AgentReply:
    raw = await agent(url, node, "status", StopWorkers(job_id=0))
    return msgspec.json.decode(raw, type=AgentReply)


def _processes_of_job(job_id: int, workdir: Path) -> list[int]:
    """Live processes whose environment names this job of this test (other tests on
    the machine run job ids of their own, from the same numbers)."""
    found = []
    needles = (f"MUSTER_JOB_ID={job_id}\0".encode(), f"SLURM_SUBMIT_DIR={workdir}\0".encode())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes()
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if all(n in env for n in needles) and state not in ("Z", "X"):
            found.append(int(name))
    return found


async def test_cancel_leaves_no_child_or_grandchild_of_a_forking_script_alive(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    script = (REPO / "examples" / "forker.sh").read_text()
    reply = await submit(
        cluster.nats_url, script, (), workdir=str(tmp_path), args=("3", "--stubborn")
    )
    job_id = reply.job_ids[0]
    out = tmp_path / f"slurm-{job_id}.out"
    text = await eventually(lambda: text_of(out), lambda t: "ready" in t, 30, "forker ready")
    await eventually(
        lambda: text_of(out), lambda t: t.count("grandchild") == 3, 10, "grandchildren"
    )
    text = out.read_text()
    pids = [
        int(ln.split()[-1]) for ln in text.splitlines() if ln.split()[0] in ("child", "grandchild")
    ]
    pids.append(int(next(ln for ln in text.splitlines() if ln.startswith("forker")).split()[1]))
    assert len(pids) == 7 and all(_alive(p) for p in pids)

    await call(cluster.nats_url, "cancel", JobSelector(user="root", job_ids=(job_id,)), Ok)

    await eventually(lambda: job_state(db, job_id), lambda s: s == "CANCELLED", 30, "cancelled")
    alive = [p for p in pids if _alive(p)]
    assert alive == []
    assert not _processes_of_job(job_id, tmp_path)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _workdir_for_anyone() -> Path:
    """A folder the job's user may write (pytest's own are private to root)."""
    workdir = Path(tempfile.mkdtemp(prefix="muster-runas-", dir="/tmp"))
    workdir.chmod(0o777)
    return workdir


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_a_job_runs_as_the_submitting_user(
    nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    try:
        account = await asyncio.to_thread(run_as_account)
    except AccountUnavailable as why:
        pytest.skip(str(why))
    workdir = await asyncio.to_thread(_workdir_for_anyone)
    # The agents' spool must be reachable by the job's user, as /var/lib/muster would be
    # (pytest's own temporary folders are private to root).
    state = await asyncio.to_thread(tempfile.mkdtemp, prefix="muster-state-", dir="/tmp")
    await asyncio.to_thread(os.chmod, state, 0o755)
    c = make_cluster(Path(state), nats_url, database_url)
    # The account submits its own job, so it needs a key of its own, as every user does.
    provision_keys(str(Path(state) / "keys"), (account.name,))
    c.start_services()
    c.start_node(nodes(1)[0])
    try:
        await nodes_up(db, 1)
        script = '#!/bin/bash\necho "user=$(id -un) USER=$USER"\n'
        reply = await submit(nats_url, script, (), workdir=str(workdir), user=account.name)
        job_id = reply.job_ids[0]

        await eventually(lambda: job_state(db, job_id), lambda s: s == "COMPLETED", 30, "done")
        out = workdir / f"slurm-{job_id}.out"
        assert (await text_of(out)).split() == [f"user={account.name}", f"USER={account.name}"]
    finally:
        c.stop_all(timeout=10)
        await asyncio.to_thread(shutil.rmtree, state, True)
        await asyncio.to_thread(shutil.rmtree, workdir, True)


async def test_a_fixed_size_job_gets_a_spare_near_its_nodes_after_an_xid_79(
    nats_url: str, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # node01, node03 under leaf1; node02, node04 under leaf2
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(4)):
        script = (
            "#!/bin/bash\n"
            'echo "attempt=$MUSTER_ATTEMPT gen=$MUSTER_GENERATION restart=$MUSTER_RESTART_COUNT"\n'
            "sleep 60\n"
        )
        reply = await submit(
            nats_url, script, ("--nodes=2", "--gpus-per-node=4", "-w", "node01,node02"),
            workdir=str(tmp_path),
        )  # fmt: skip
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 30, "running")
        await inject(nats_url, "node01", 79)

        row = await eventually(
            lambda: db.fetchrow(
                "SELECT state, nodes, restart_count FROM job_runs WHERE job_id = $1", job_id
            ),
            lambda r: r is not None and r["restart_count"] == 1 and r["state"] == "RUNNING",
            30,
            "restart on a spare",
        )
        assert row is not None
        assert sorted(row["nodes"]) == ["node02", "node03"]  # node03: node01's leaf
        live = await db.fetch(
            "SELECT n.node FROM allocation_nodes n JOIN allocations a USING (alloc_id)"
            " WHERE a.job_id = $1 AND n.live ORDER BY n.node",
            job_id,
        )
        assert [r["node"] for r in live] == ["node02", "node03"]
        assert await db.fetchval("SELECT count(*) FROM allocations WHERE job_id = $1", job_id) == 1
        history = await db.fetch(
            "SELECT outcome FROM attempts WHERE job_id = $1 ORDER BY attempt, seq", job_id
        )
        assert "replace" in (history[0]["outcome"] or "")
        # A spare keeps the allocation (attempt 1) and starts its next generation.
        log = await eventually(
            lambda: text_of(tmp_path / f"slurm-{job_id}.out"), lambda t: "gen=1" in t, 20
        )
        assert "attempt=1 gen=0 restart=0" in log and "attempt=1 gen=1 restart=1" in log, log


async def test_an_elastic_job_grows_back_when_its_lost_node_returns(
    nats_url: str, database_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, nodes(3), env={"MUSTER_GROW_BACK": "true"}
    ):
        script = '#!/bin/bash\necho "gen=$MUSTER_RESTART_COUNT world=$WORLD_SIZE"\nsleep 60\n'
        reply = await submit(
            nats_url, script, ("--nodes=2:3", "--gpus-per-node=4"), workdir=str(tmp_path)
        )
        job_id = reply.job_ids[0]
        await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 30, "running")
        await inject(nats_url, "node02", 79)
        await eventually(
            lambda: db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id),
            lambda n: n is not None and len(n) == 2 and "node02" not in n,
            30,
            "shrunk to 2",
        )
        await agent(nats_url, "node02", "reboot", StopWorkers(job_id=0))

        row = await eventually(
            lambda: db.fetchrow(
                "SELECT state, nodes, restart_count FROM job_runs WHERE job_id = $1", job_id
            ),
            lambda r: r is not None and len(r["nodes"]) == 3 and r["state"] == "RUNNING",
            40,
            "grown back to 3",
        )
        assert row is not None
        assert sorted(row["nodes"]) == ["node01", "node02", "node03"]
        assert row["restart_count"] == 2
        # RUNNING once the workers were spawned: their first line may come after
        await eventually(
            lambda: text_of(tmp_path / f"slurm-{job_id}.out"),
            lambda t: "gen=2 world=3" in t,
            20,
            "the grown generation's line",
        )
