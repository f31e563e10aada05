"""End to end on a local cluster: steps side by side in one allocation get GPUs of their
own, as Slurm's steps do (docs/steps.md, steps_core.layout).

A batch job holding two GPUs starts two one-GPU steps in the background (a sweep
inside one allocation; one says `--gpus-per-task=1`, the other `--gres=gpu:1`, as older
scripts do): each sees a different GPU. While both run, an `--overlap` step runs at once
on a GPU they hold, an `-I1` step gives up after a second (exit 1), and a third plain
step waits ("step creation temporarily disabled") until one of them ends, then gets
its GPU.
Before, every such step saw the first GPU of the node, all at once."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from muster.render import show_lines
from shared.api import ShowJobReply, ShowJobRequest
from tests.support.cluster import job_end, nodes, running_cluster, submit

pytestmark = pytest.mark.slow

PY = sys.executable


def sweep(work: Path, keys: Path) -> str:
    srun = f"{PY} -m muster.cli srun"
    task = 'echo "$CUDA_VISIBLE_DEVICES" > {0}; while [ ! -f go ]; do sleep 0.1; done'
    return f"""#!/bin/bash
export MUSTER_KEY_DIR={keys}
cd {work}
{srun} -n1 --gpus-per-task=1 bash -c '{task.format("a")}' &
{srun} -n1 --gres=gpu:1 bash -c '{task.format("b")}' &
while [ ! -s a ] || [ ! -s b ]; do sleep 0.1; done
{srun} --overlap -n1 --gpus-per-task=1 bash -c 'echo "$CUDA_VISIBLE_DEVICES" > o'
{srun} -I1 -n1 --gpus-per-task=1 true 2> i.err; echo "rc=$?" > i
{srun} --exclusive -n1 --gpus-per-task=1 bash -c 'echo "$CUDA_VISIBLE_DEVICES" > c' 2> c.err &
while ! grep -q "temporarily disabled" c.err; do sleep 0.1; done
touch go
wait
"""


async def test_side_by_side_steps_get_gpus_of_their_own_and_a_busy_one_waits(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(1)):
        script = sweep(work, tmp_path / "state" / "keys")
        argv = ("-N", "1", "--gpus-per-node=2", "-t", "5")
        job = (await submit(nats_url, script, argv, workdir=str(work))).job_ids[0]
        state = (await job_end(db, job, 120.0))["state"]
        assert state == "COMPLETED", (work / "c.err").read_text()
        held = json.loads(
            await db.fetchval("SELECT gpus::text FROM job_runs WHERE job_id = $1", job)
        )["node01"]
        # -I1: the step could not be made within a second; srun gave up, said why
        assert (work / "i").read_text().strip() == "rc=1"
        assert "not created within 1 s (--immediate)" in (work / "i.err").read_text()
        seen = {name: (work / name).read_text().strip() for name in ("a", "b", "o", "c")}
        assert sorted([seen["a"], seen["b"]]) == sorted(str(g) for g in held), seen
        assert seen["o"] == str(min(held)), seen  # --overlap: the first, held or not
        assert seen["c"] in (seen["a"], seen["b"]), seen  # the one freed first
        said = (work / "c.err").read_text()
        assert "step creation temporarily disabled, retrying" in said, said
        assert "the job's running steps hold 2 of its 2 there" in said, said
        assert f"srun: step created for job {job}" in said, said
        shown = await call(nats_url, "show", ShowJobRequest(user="root", job_id=job), ShowJobReply)
        assert [s.state for s in shown.steps] == ["COMPLETED"] * 4, shown.steps
        listed = [line for line in show_lines(shown) if line.startswith(f"   Step {job}.")]
        assert sum(" GPUs=node01:" in line for line in listed) == 3, listed  # not --overlap
        rows = await db.fetch(
            "SELECT step_id, gpus::text FROM job_steps WHERE job_id = $1 ORDER BY step_id", job
        )
        holds = [json.loads(r["gpus"]) for r in rows]
        assert holds.count({}) == 1 and len(holds) == 4, holds  # the --overlap one holds none
