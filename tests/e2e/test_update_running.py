"""End to end on a local cluster: a running job's time limit changed in place (`muster
update --time`, `scontrol update TimeLimit=`), with its srun step.

Raised: a job of a 15 s limit whose batch script's srun step sleeps 22 s has its limit
raised to two minutes once it runs; the step and the job complete. Before, the
launcher's timer fell due at 15 s, found nothing due under the new spec and went on
polling a due time in the past, and srun's coordinator gave the node up at the old limit
plus its margin (here 2 s): the step FAILED, and the script with it.

Lowered: a job of a 10-minute limit running `srun sleep` has its limit lowered by 9:55
(`TimeLimit=-9:55`, a change of its own limit) to 5 s; it ends TIMEOUT within seconds,
its step's task gone from `ps`. Before, the new limit was read only once the old one
came due: ten minutes on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from shared.api import Ok, UpdateRequest
from tests.support.cluster import (
    eventually,
    job_end,
    job_state,
    nodes,
    processes,
    ready,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

MUSTER = f"{sys.executable} -m muster.cli"
RAISED = """#!/bin/bash
export MUSTER_KEY_DIR={keys}
{muster} srun sleep 22.5 || exit 7
touch {work}/raised-done
"""
LOWERED = """#!/bin/bash
export MUSTER_KEY_DIR={keys}
{muster} srun sleep 610.5
"""


async def update(url: str, job: int, limit_s: int | None, change_s: int | None = None) -> Ok:
    req = UpdateRequest(
        user="root", job_refs=(str(job),), time_limit_s=limit_s, time_limit_change_s=change_s
    )
    return await call(url, "update", req, Ok)


async def step_running(db: asyncpg.Connection, job: int) -> None:
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM job_steps WHERE job_id = $1 AND state = 'RUNNING'", job
        ),
        lambda n: n == 1,
        60,
        f"job {job}'s step running",
    )


async def test_a_running_jobs_limit_raised_lets_it_and_its_step_finish_and_lowered_ends_it(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = {"MUSTER_STEP_SILENCE_S": "2"}
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(1), env=env):
        keys = tmp_path / "state" / "keys"
        script = RAISED.format(keys=keys, muster=MUSTER, work=work)
        raised = (await submit(nats_url, script, ("-t", "0:15"), workdir=str(work))).job_ids[0]
        await step_running(db, raised)
        said = await update(nats_url, raised, 120)
        assert said.job_ids == (raised,), said
        end = await job_end(db, raised, 90.0)
        assert end["state"] == "COMPLETED", end
        step = await db.fetchrow("SELECT state, exit_code FROM job_steps WHERE job_id = $1", raised)
        assert step is not None and (step["state"], step["exit_code"]) == ("COMPLETED", 0), step
        assert (work / "raised-done").exists()

        script = LOWERED.format(keys=keys, muster=MUSTER)
        lowered = (await submit(nats_url, script, ("-t", "10"), workdir=str(work))).job_ids[0]
        await step_running(db, lowered)
        assert processes("sleep 610.5"), "the step's task runs"
        await update(nats_url, lowered, None, -595)
        assert await db.fetchval("SELECT time_limit_s FROM jobs WHERE job_id = $1", lowered) == 5
        assert (await job_end(db, lowered, 60.0))["state"] == "TIMEOUT"  # not in 10 minutes
        await eventually(
            lambda: ready(processes("sleep 610.5")), lambda left: not left, 30, "task gone"
        )
        assert await job_state(db, lowered) == "TIMEOUT"
