"""End to end, on real NATS, PostgreSQL and processes: GPU health. Faults are injected
at the simulated GPU of a node agent, so they travel probe -> monitor -> placer and
launcher exactly as in production; nodes come back by a (simulated) reboot and its
health check, or by an operator."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg

from muster.client import agent, call
from muster.cluster import Cluster
from shared import embedded
from shared.api import InjectFault, NodeAction, NodesReply, Ok, QueueRequest
from shared.events import Event, NodeFault, decode
from tests.support.cluster import (
    FAST,
    eventually,
    inject,
    job_state,
    kill9,
    nodes,
    nodes_up,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

NODES = nodes(3)
SLEEPER = "#!/bin/bash\nsleep 30\n"
SUSPECT_S = float(FAST["MUSTER_HEARTBEAT_TIMEOUT_S"])
DOWN_S = float(FAST["MUSTER_DOWN_AFTER_S"])
# For a pause that must end before DOWN: room for a busy machine between the stages,
# and the agent's own fence (it stops its jobs) after the monitor's SUSPECT.
ROOMY = {"MUSTER_HEARTBEAT_TIMEOUT_S": "2", "MUSTER_FENCE_S": "10", "MUSTER_DOWN_AFTER_S": "12"}
# For a bus outage longer than down_after_s: the agents' fence is set past the outage,
# so only the monitor's guard stands between the outage and DOWN.
OUTAGE = {"MUSTER_HEARTBEAT_TIMEOUT_S": "2", "MUSTER_FENCE_S": "30", "MUSTER_DOWN_AFTER_S": "4"}


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, list(NODES)) as c:
        yield c


@contextmanager
def paused(cluster: Cluster, *names: str) -> Iterator[None]:
    """SIGSTOP the agents of `names` (a hung machine: no heartbeat, workers untouched);
    SIGCONT them on the way out, whatever happened."""
    pids = [cluster.pids[f"node-{n}"] for n in names]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


async def states_until(
    db: asyncpg.Connection, node: str, want: str, seen: list[str] | None = None
) -> list[str]:
    """The states `node` was seen in, in order (after `seen`), polling until `want`."""
    seen = [] if seen is None else seen
    timeout = 30.0
    deadline = time.monotonic() + timeout
    while not seen or seen[-1] != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"{node} not {want} in {timeout}s; seen {seen}")
        state = await node_state(db, node)
        if not seen or seen[-1] != state:
            seen.append(state)
        await asyncio.sleep(0.1)
    return seen


async def node_state(db: asyncpg.Connection, node: str) -> str:
    state: str = await db.fetchval("SELECT state FROM nodes WHERE name = $1", node)
    return state


async def running_job(db: asyncpg.Connection, url: str, workdir: Path) -> tuple[int, str]:
    """A fixed-size one-node job that holds all four GPUs of its node, and that node."""
    reply = await submit(url, SLEEPER, ("--nodes=1", "--gpus-per-node=4"), workdir=str(workdir))
    job_id = reply.job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", what="running")
    nodes_: list[str] = await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id)
    return job_id, nodes_[0]


async def reboot(url: str, node: str) -> None:
    await agent(url, node, "reboot", InjectFault())


async def test_xid_79_takes_the_node_out_and_its_fixed_size_job_restarts_elsewhere(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)

    await inject(cluster.nats_url, victim, 79, gpu=1)

    await eventually(lambda: node_state(db, victim), lambda s: s == "FAILED", what="FAILED")
    row = await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] == "RUNNING" and victim not in r["nodes"],
        what="the job running again on another node",
    )
    assert row is not None
    assert len(row["nodes"]) == 1
    gpu = await db.fetchrow(
        "SELECT healthy, last_xid FROM gpus WHERE node = $1 AND idx = 1", victim
    )
    assert gpu is not None
    assert (gpu["healthy"], gpu["last_xid"]) == (False, 79)
    view = await call(cluster.nats_url, "nodes", QueueRequest(user="root"), NodesReply)
    [shown] = [n for n in view.nodes if n.name == victim]
    assert shown.state == "FAILED" and shown.last_fault is not None
    assert shown.last_fault["xid"] == 79 and not shown.gpus[1].healthy

    # The reboot clears it: a new boot passes its health check and the node is UP.
    await reboot(cluster.nats_url, victim)
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP again")
    assert await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", victim)


async def test_xid_13_fails_only_the_job_and_the_node_stays_up(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, node = await running_job(db, cluster.nats_url, tmp_path)

    await inject(cluster.nats_url, node, 13, gpu=2)

    await eventually(lambda: job_state(db, job_id), lambda s: s == "FAILED", what="job FAILED")
    reason = await db.fetchval("SELECT reason FROM job_runs WHERE job_id = $1", job_id)
    assert "xid 13" in reason
    assert await node_state(db, node) == "UP"
    assert await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", node)
    assert await db.fetchval("SELECT last_xid FROM gpus WHERE node = $1 AND idx = 2", node) == 13

    # And the node takes new work.
    again = await submit(cluster.nats_url, "#!/bin/bash\ntrue\n", (f"--nodelist={node}",))
    await eventually(
        lambda: job_state(db, again.job_ids[0]), lambda s: s == "COMPLETED", what="new job"
    )


async def test_a_killed_node_agent_is_down_within_the_timeout_and_its_job_moves(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)

    killed_at = time.monotonic()
    kill9(cluster, f"node-{victim}")

    seen = await states_until(db, victim, "DOWN")
    assert seen == ["UP", "SUSPECT", "DOWN"]
    # down_after_s after the last heartbeat (sent at most one interval before the kill),
    # plus one liveness pass of timeout / 4.
    assert time.monotonic() - killed_at < DOWN_S + SUSPECT_S / 4 + 3.0  # + a busy machine
    await eventually(
        lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] == "RUNNING" and victim not in r["nodes"],
        what="the job running again on another node",
    )

    # A restarted agent is a new boot: it passes its health check and is UP again.
    [node] = [n for n in NODES if n.name == victim]
    cluster.start_node(node)
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP again")


async def test_a_flapping_node_stays_out_until_an_operator_resumes_it(
    cluster: Cluster, db: asyncpg.Connection
) -> None:
    node = NODES[0].name
    url = cluster.nats_url
    for attempt in range(3):
        await inject(url, node, 79, gpu=attempt)
        await eventually(lambda: node_state(db, node), lambda s: s == "FAILED", what="FAILED")
        before = await db.fetchval("SELECT boot_id FROM nodes WHERE name = $1", node)
        await reboot(url, node)
        if attempt < 2:
            await eventually(lambda: node_state(db, node), lambda s: s == "UP", what="UP")

    # The third failure within the window holds it: a passing check is not enough.
    await eventually(
        lambda: db.fetchval("SELECT last_check->>'boot_id' FROM nodes WHERE name = $1", node),
        lambda boot: boot not in (None, before),
        what="the check after the last reboot",
    )
    row = await db.fetchrow("SELECT state, held, reason FROM nodes WHERE name = $1", node)
    assert row is not None
    assert row["held"] and row["state"] == "FAILED" and "flapping" in row["reason"]
    await asyncio.sleep(1.0)
    assert await node_state(db, node) == "FAILED"

    await call(url, "resume", NodeAction(user="root", node=node, reason="replaced the riser"), Ok)
    await eventually(lambda: node_state(db, node), lambda s: s == "UP", what="resumed")
    assert not await db.fetchval("SELECT held FROM nodes WHERE name = $1", node)


async def test_a_gpu_reset_xid_drains_the_node_and_the_reset_brings_it_back(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, node = await running_job(db, cluster.nats_url, tmp_path)
    # Drain, reset and check of an idle node take a fraction of a second: a poll of the
    # node's state can miss them, so the test watches the events the monitor publishes.
    seen: list[Event] = []

    async def note(msg: Msg) -> None:
        seen.append(decode(msg.data))

    nc = await nats.connect(cluster.nats_url)
    try:
        sub = await nc.subscribe("muster.node.>", cb=note)
        await nc.flush()
        await inject(cluster.nats_url, node, 62, gpu=1)

        # The job moves away (its node is drained), the idle node is reset, checked, back.
        await eventually(
            lambda: db.fetchrow("SELECT state, nodes FROM job_runs WHERE job_id = $1", job_id),
            lambda r: r is not None and r["state"] == "RUNNING" and node not in r["nodes"],
            30,
            "job moved",
        )
        await eventually(
            lambda: kinds_about(seen, node),
            lambda kinds: "NodeRecovered" in kinds,
            30,
            "the node recovered",
        )
        await sub.unsubscribe()
    finally:
        await nc.close()
    [fault] = [e for e in seen if isinstance(e, NodeFault) and e.node == node]
    assert (fault.xid, fault.gpu, fault.fault_class) == (62, 1, "gpu_reset")
    await eventually(lambda: node_state(db, node), lambda s: s == "UP", 30, "back in service")
    healthy = await db.fetchval("SELECT bool_and(healthy) FROM gpus WHERE node = $1", node)
    assert healthy
    last = await db.fetchval("SELECT last_fault FROM nodes WHERE name = $1", node)
    assert '"xid": 62' in last


async def kinds_about(seen: list[Event], node: str) -> list[str]:
    return [type(e).__name__ for e in seen if getattr(e, "node", None) == node]


async def attempt_on(db: asyncpg.Connection, job_id: int) -> tuple[str, int, list[str]]:
    r = await db.fetchrow("SELECT state, attempt, nodes FROM job_runs WHERE job_id = $1", job_id)
    assert r is not None
    return r["state"], r["attempt"], list(r["nodes"])


async def test_a_paused_agent_is_suspect_then_down_and_its_job_moves(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)
    _, attempt, _ = await attempt_on(db, job_id)

    with paused(cluster, victim):
        seen = await states_until(db, victim, "SUSPECT")
        # SUSPECT takes no new work but keeps its job where it is.
        assert await attempt_on(db, job_id) == ("RUNNING", attempt, [victim])
        seen = await states_until(db, victim, "DOWN", seen)
        assert seen == ["UP", "SUSPECT", "DOWN"]
        *_, where = await eventually(
            lambda: attempt_on(db, job_id),
            lambda r: r[0] == "RUNNING" and victim not in r[2],
            what="the job running again on another node",
        )
        assert len(where) == 1  # a spare took the node's place

    # Resumed, the same boot heartbeats again and the node returns.
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP again")


async def test_an_agent_paused_for_less_than_down_after_returns_with_no_fault(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    async with running_cluster(
        tmp_path / "state", nats_url, database_url, db, list(NODES), env=ROOMY
    ) as cluster:
        job_id, victim = await running_job(db, cluster.nats_url, tmp_path)
        before = await attempt_on(db, job_id)
        faults = await db.fetchval("SELECT fault_count FROM nodes WHERE name = $1", victim)

        with paused(cluster, victim):
            seen = await states_until(db, victim, "SUSPECT")
        seen = await states_until(db, victim, "UP", seen)

        assert seen == ["UP", "SUSPECT", "UP"]
        assert await attempt_on(db, job_id) == before  # same attempt, same node
        assert await db.fetchval("SELECT fault_count FROM nodes WHERE name = $1", victim) == faults


async def test_half_the_nodes_silent_at_once_are_not_declared_down(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    four = nodes(4)
    state = tmp_path / "state"
    async with running_cluster(state, nats_url, database_url, db, four) as cluster:
        silent = [four[0].name, four[1].name]
        with paused(cluster, *silent):
            for name in silent:
                await states_until(db, name, "SUSPECT")
            await asyncio.sleep(2 * DOWN_S)  # well past down_after_s
            states = {n: await node_state(db, n) for n in silent}
            assert states == dict.fromkeys(silent, "SUSPECT")
        for name in silent:
            await eventually(partial(node_state, db, name), lambda s: s == "UP", what="back")
        assert not await db.fetchval("SELECT count(*) FROM nodes WHERE state = 'DOWN'")

    log = (state / "logs" / "health.log").read_text()
    assert log.count("down guard holding: no node is declared DOWN (mass_silence)") == 1
    assert "down guard released was=mass_silence" in log


async def test_an_agent_restarted_under_its_running_job_is_cleaning_until_the_launcher_looked(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    job_id, victim = await running_job(db, cluster.nats_url, tmp_path)
    before = await attempt_on(db, job_id)

    # Restarted at once, the agent re-adopts the job's worker and registers it.
    kill9(cluster, f"node-{victim}")
    [node] = [n for n in NODES if n.name == victim]
    cluster.start_node(node)
    health_log = cluster.state_dir / "logs" / "health.log"
    back = f"node node_recovered node={victim} was=CLEANING now=UP"
    await eventually(
        lambda: asyncio.to_thread(health_log.read_text),
        lambda text: back in text,
        what="the node back from CLEANING",
    )

    # It was out of service between its registration and the launcher's node.cleaned;
    # the launcher kept the live attempt's worker, so the job runs on, untouched.
    log = health_log.read_text()
    assert re.search(rf"node registered node={victim} .*workers=1", log)
    # (from UP, or from SUSPECT when the new agent took longer than the timeout)
    assert re.search(rf"node node_cleaning node={victim} was=\w+ now=CLEANING", log)
    # the line is logged inside the transaction that makes the node UP: its commit may
    # come a moment later
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", what="UP committed")
    assert await attempt_on(db, job_id) == before
    assert not await db.fetchval("SELECT clean_boot_id FROM nodes WHERE name = $1", victim)


async def test_a_nats_restart_longer_than_down_after_downs_no_node_and_moves_no_job(
    tmp_path: Path, database_url: str, db: asyncpg.Connection
) -> None:
    """The operator's story: NATS killed and back some seconds later. Before, every node
    went DOWN and every job moved; now the monitor, which heard nobody either, declares
    nobody DOWN while its bus is down, nor within down_after_s of its return."""
    server = embedded.start_nats(tmp_path / "own-nats")
    port = int(server.url.rsplit(":", 1)[1])
    state = tmp_path / "state"
    try:
        async with running_cluster(state, server.url, database_url, db, nodes(4), env=OUTAGE) as c:
            jobs = [await running_job(db, c.nats_url, tmp_path) for _ in range(3)]
            before = {job_id: await attempt_on(db, job_id) for job_id, _ in jobs}

            await asyncio.to_thread(server.kill)
            await asyncio.sleep(float(OUTAGE["MUSTER_DOWN_AFTER_S"]) + 2)  # past down_after_s
            server = await asyncio.to_thread(embedded.start_nats, tmp_path / "own-nats", port)
            back = time.monotonic()

            await nodes_up(db, 4)
            # Through the whole grace after the return: still nobody DOWN, nothing moved.
            grace_ends = back + float(OUTAGE["MUSTER_DOWN_AFTER_S"]) + 2
            await asyncio.sleep(max(0.0, grace_ends - time.monotonic()))
            assert {job_id: await attempt_on(db, job_id) for job_id, _ in jobs} == before
            assert await db.fetchval("SELECT count(*) FROM nodes WHERE state = 'UP'") == 4
    finally:
        await asyncio.to_thread(server.stop)
    log = (state / "logs" / "health.log").read_text()
    assert "node node_down" not in log
    assert "down guard holding: no node is declared DOWN (bus_down)" in log


async def test_a_job_requeued_without_a_failed_node_takes_it_again_once_it_is_back(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    """A job as wide as the cluster, requeued without the node an XID took out (no
    spare), runs on that node again once a reboot brought it back: an exclusion held
    for ever left it pending with nothing to wait for."""
    argv = ("--nodes=3", "--gpus-per-node=4")
    job_id = (await submit(cluster.nats_url, SLEEPER, argv, workdir=str(tmp_path))).job_ids[0]
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", what="running")
    victim = NODES[0].name
    await inject(cluster.nats_url, victim, 79)
    row = await eventually(
        lambda: db.fetchrow("SELECT state, excluded_nodes FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] == "REQUEUED",
        what="requeued without the failed node",
    )
    assert row is not None
    assert row["excluded_nodes"] == [victim]
    await eventually(lambda: node_state(db, victim), lambda s: s == "FAILED", what="FAILED")

    await reboot(cluster.nats_url, victim)
    await eventually(lambda: node_state(db, victim), lambda s: s == "UP", 60, "back UP")
    row = await eventually(
        lambda: db.fetchrow(
            "SELECT state, nodes, restart_count FROM job_runs WHERE job_id = $1", job_id
        ),
        lambda r: r is not None and r["state"] == "RUNNING",
        60,
        "running again on every node",
    )
    assert row is not None
    assert sorted(row["nodes"]) == sorted(n.name for n in NODES) and row["restart_count"] == 1
