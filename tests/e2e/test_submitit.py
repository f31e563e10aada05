"""End to end with the real `submitit` package on a local cluster: a function's result,
an array from `map_array`, a cancel, and a job preempted mid-run that checkpoints
through submitit's `checkpoint()` and resumes where it stopped when Muster requeues it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import eventually, job_state, nodes, running_cluster, submit

if TYPE_CHECKING:  # at run time submitit comes from importorskip, below
    from submitit import AutoExecutor

submitit = pytest.importorskip("submitit", reason="the submitit extra (installed with dev)")
jobs = pytest.importorskip("tests.support.submitit_jobs")

pytestmark = pytest.mark.slow

CONFIG = """
[cluster]
name = "submitit-test"
default_partition = "normal"

[partitions.normal]
nodes = ["node01"]
default_time = "10:00"
max_time = "1:00:00"
priority_tier = 10
preempt_mode = "requeue"
grace_time = "5"

[partitions.urgent]
nodes = ["node01"]
default_time = "10:00"
max_time = "1:00:00"
priority_tier = 50
preempt_mode = "off"
can_preempt = ["normal"]

[accounts.root]
shares = 1

[users.root]
accounts = ["root"]

[roles]
operators = ["root"]
"""


@pytest.fixture
async def cluster(
    tmp_path: Path,
    nats_url: str,
    database_url: str,
    db: asyncpg.Connection,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Cluster]:
    config = tmp_path / "cluster.toml"
    config.write_text(CONFIG)
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(1),
        env={"MUSTER_CLUSTER_CONFIG": str(config)},
    ) as c:
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM partition_policy"),
            lambda n: n == 2,
            30,
            "policy",
        )
        # The plugin drives the `muster` CLI, which finds the cluster and the user's key
        # the way a user's shell does.
        monkeypatch.setenv("MUSTER_NATS_URL", c.nats_url)
        yield c


def executor(folder: Path, **params: object) -> AutoExecutor:
    ex: AutoExecutor = submitit.AutoExecutor(folder=folder, cluster="muster")
    ex.update_parameters(**{"timeout_min": 10, "gpus_per_node": 1, **params})
    return ex


async def test_a_function_returns_its_result_and_a_cancel_ends_a_job(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    ex = executor(tmp_path / "jobs" / "%j", name="adder")
    job = ex.submit(jobs.add, 2, 40)
    assert await asyncio.to_thread(job.result) == 42
    # the result file is written just before the script exits and its run ends
    await eventually(lambda: job_state(db, int(job.job_id)), lambda s: s == "COMPLETED", 30)
    assert job.get_info()["State"] == "COMPLETED"  # a forced `muster queue` read
    assert (tmp_path / "jobs" / job.job_id / f"{job.job_id}_0_log.out").exists()

    sleeper = ex.submit(jobs.nap, 300)
    await eventually(lambda: job_state(db, int(sleeper.job_id)), lambda s: s == "RUNNING", 60)
    await asyncio.to_thread(sleeper.cancel)
    await eventually(lambda: job_state(db, int(sleeper.job_id)), lambda s: s == "CANCELLED", 60)
    with pytest.raises(submitit.core.utils.UncompletedJobError):
        await asyncio.to_thread(sleeper.result)


async def test_map_array_runs_one_array_whose_tasks_return_in_order(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    ex = executor(tmp_path / "array", slurm_array_parallelism=2)
    done = ex.map_array(jobs.square, [1, 2, 3])
    assert [j.job_id.split("_")[1] for j in done] == ["0", "1", "2"]
    assert len({j.job_id.split("_")[0] for j in done}) == 1  # one array
    results = await asyncio.to_thread(lambda: [j.result() for j in done])
    assert results == [(1, "0"), (4, "1"), (9, "2")]
    array_id = int(done[0].job_id.split("_")[0])

    async def states() -> list[tuple[int, str]]:
        rows = await db.fetch(
            "SELECT j.array_task_id, r.state FROM jobs j JOIN job_runs r USING (job_id)"
            " WHERE j.array_job_id = $1 ORDER BY 1",
            array_id,
        )
        return [(r["array_task_id"], r["state"]) for r in rows]

    # submitit's result file is written before the task's script exits: its run ends
    # (COMPLETED) a moment after `result()` returned.
    done_states = [(0, "COMPLETED"), (1, "COMPLETED"), (2, "COMPLETED")]
    assert await eventually(states, lambda s: s == done_states, 30, "tasks ended") == done_states


async def test_a_preempted_job_checkpoints_and_resumes_where_it_stopped(
    cluster: Cluster, db: asyncpg.Connection, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    ex = executor(tmp_path / "ckpt", gpus_per_node=4, slurm_partition="normal")
    job = ex.submit(jobs.Counter(), 40, 0.2, str(log))
    await eventually(
        lambda: asyncio.to_thread(lambda: log.read_text() if log.exists() else ""),
        lambda text: len(text.splitlines()) >= 5,
        90,
        "the counter under way",
    )
    urgent = await submit(cluster.nats_url, "#!/bin/bash\nsleep 2\n", ("-p", "urgent", "-G", "4"))
    await eventually(
        lambda: job_state(db, urgent.job_ids[0]), lambda s: s == "COMPLETED", 90, "urgent job"
    )

    steps, lines = await asyncio.to_thread(job.result)
    assert steps == 40
    seen = [tuple(map(int, line.split())) for line in lines if line]
    first = [s for a, s in seen if a == 0]
    again = [s for a, s in seen if a == 1]
    assert first and again, seen
    # The requeued attempt continued from the checkpoint, not from the first step.
    assert again[0] == first[-1] + 1 or again[0] == first[-1], seen
    assert again[-1] == 40
    row = await eventually(
        lambda: db.fetchrow(
            "SELECT state, restart_count FROM job_runs WHERE job_id = $1", int(job.job_id)
        ),
        lambda r: r is not None and r["state"] == "COMPLETED",
        30,
        "the run ended",
    )
    assert row is not None and (row["state"], row["restart_count"]) == ("COMPLETED", 1)
