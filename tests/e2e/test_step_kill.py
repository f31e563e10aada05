"""End to end on a local cluster: `srun -K` (--kill-on-bad-exit) on two nodes. The task
on node02 exits 4 at once; node01's would sleep for an hour (a rank left waiting on a
collective for a peer that died). With -K the launcher stops the step's tasks on every
node once node02 answers: the step is FAILED with exit 4, srun exits 4, and `ps` shows
no sleep left. Before, -K was refused as an unknown option, and such a step ran until
the job's time limit. A second step's node02 task segfaults: the step is FAILED with
139 (signal 11), the crash, not CANCELLED with the SIGTERM -K sent node01's task (143),
as it was recorded before tasks' ends said whether a stop ended them. A third step is
asked for by an srun whose Ctrl-C (its stop) reached the launcher and the nodes first,
as when srun is interrupted while its request is in flight: it starts nothing and is
CANCELLED; before, it ran on for an srun that was gone."""

from __future__ import annotations

import sys
from pathlib import Path

import asyncpg
import pytest

from tests.support.cluster import job_end, nodes, processes, running_cluster, submit

pytestmark = pytest.mark.slow

PY = sys.executable
TASK = '[ "$SLURMD_NODENAME" = node02 ] && exit 4; exec sleep 3201'
CRASH = '[ "$SLURMD_NODENAME" = node02 ] && kill -SEGV $$; exec sleep 3202'
EARLY_STOP = """
import os
from muster.client import nats_url, request
from muster.steps import step_request
from shared.api import Ok, StepCancelRequest, StepReply
req = step_request(["-N", "2", "sleep", "3203"], dict(os.environ), os.getcwd())
stop = StepCancelRequest(user=req.user, job_id=req.job_id, output_dir=req.output_dir)
request(nats_url(), "step_cancel", stop, Ok, timeout=30)
print(request(nats_url(), "step", req, StepReply, timeout=30).state)
"""


def script(work: Path, keys: Path) -> str:
    return f"""#!/bin/bash
export MUSTER_KEY_DIR={keys}
if [ "$SLURM_NODEID" = 0 ]; then
  {PY} -m muster.cli srun -K bash -c '{TASK}'; echo "rc=$?" > {work}/rc
  {PY} -m muster.cli srun -K bash -c '{CRASH}'; echo "rc=$?" > {work}/rc2
  {PY} -c '{EARLY_STOP}' > {work}/early
  touch {work}/done
else
  while [ ! -f {work}/done ]; do sleep 0.2; done
fi
"""


async def test_a_bad_exit_on_one_node_ends_the_steps_tasks_on_every_node(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(2)):
        keys = tmp_path / "state" / "keys"
        argv = ("-N", "2", "--gpus-per-node=1", "-t", "5")
        job = (await submit(nats_url, script(work, keys), argv, workdir=str(work))).job_ids[0]
        assert (await job_end(db, job, 120.0))["state"] == "COMPLETED"
        steps = await db.fetch(
            "SELECT state, exit_code, signal, extract(epoch FROM ended_at - started_at) AS s"
            " FROM job_steps WHERE job_id = $1 ORDER BY step_id",
            job,
        )
        ends = [(r["state"], r["exit_code"], r["signal"]) for r in steps]
        assert ends == [("FAILED", 4, None), ("FAILED", 139, 11), ("CANCELLED", None, None)]
        assert (work / "early").read_text().strip() == "CANCELLED"
        assert (work / "rc").read_text().strip() == "rc=4"
        assert (work / "rc2").read_text().strip() == "rc=139"
        assert not processes("sleep 3201"), "node01's task was stopped"
        assert not processes("sleep 3202"), "node01's task was stopped"
        assert not processes("sleep 3203"), "a step stopped before it was made ran nothing"
        # for node02's end, not the 5-minute time limit
        assert all(float(r["s"]) < 60.0 for r in steps), steps
