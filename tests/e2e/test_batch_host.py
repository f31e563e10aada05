"""End to end: sbatch runs a script on the job's first node only, as Slurm's batch host
does, so the script Slurm users write — an unguarded `srun` on a two-node job — makes
one step with a task on each node (or the job's `--ntasks-per-node` on each, each
bound to the job's `--gpus-per-task`) and completes; `scontrol show hostnames` names its
first node, the rendezvous host. The other node holds its share of
the allocation for the step and is let go when the script ends; its exit status is the
job's (docs/steps.md). And an srun that comes before every node's worker started (a
node's site prolog still running) waits for them, as Slurm's, where it was refused."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg
import pytest

from shared.states import TERMINAL
from tests.support.cluster import eventually, nodes, ready, run_cli, running_cluster

pytestmark = pytest.mark.slow

TASK = 'echo "R$SLURM_PROCID@$SLURMD_NODENAME"'
SRUN = f"""#!/bin/bash
#SBATCH -N 2 --gpus-per-node=1 -t 5
export MUSTER_KEY_DIR={{keys}}  # the launcher passes no MUSTER_ variable of the submitter's
echo "batch on $SLURMD_NODENAME"
{sys.executable} -m muster.shims srun bash -c '{TASK}' 2> srun-$SLURM_JOB_ID.err | sort
"""
# sbatch's --ntasks-per-node: the script is told the job's tasks, and srun runs them;
# its first node is the rendezvous host, found as every Slurm training script finds it
TASKS = f"""#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=2 -t 5
export MUSTER_KEY_DIR={{keys}}
echo "tasks $SLURM_NTASKS"
hosts=$({sys.executable} -m muster.shims scontrol show hostnames "$SLURM_JOB_NODELIST")
echo "master $(echo "$hosts" | head -n 1)"
{sys.executable} -m muster.shims srun bash -c '{TASK}' 2> /dev/null | sort
"""
# sbatch's --gpus-per-task: a bare srun binds each task to its own GPU, as Slurm's
GPU = 'echo "R$SLURM_PROCID $CUDA_VISIBLE_DEVICES"'
GPU_TASKS = f"""#!/bin/bash
#SBATCH -N 1 --ntasks-per-node=2 --gpus-per-task=1 -t 5
export MUSTER_KEY_DIR={{keys}}
echo "per task $SLURM_GPUS_PER_TASK, tasks $SLURM_TASKS_PER_NODE, gpus $SLURM_JOB_GPUS"
{sys.executable} -m muster.shims srun bash -c '{GPU}' 2> /dev/null | sort
"""
ENDS = sorted(TERMINAL)
ENDED = "SELECT state, exit_code FROM job_runs WHERE job_id = $1 AND state = ANY($2::text[])"


def sbatch_in(folder: Path, url: str, bin_dir: Path) -> Callable[..., int]:
    """`sbatch --parsable WORDS` as a user's shell runs it (the shims on PATH) in
    `folder`: the job's id."""
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MUSTER_NATS_URL": url}
    wrote = run_cli("shims", str(bin_dir), env={})
    assert wrote.returncode == 0, wrote.stderr

    def sbatch(*words: str) -> int:
        out = subprocess.run(
            ["sbatch", "--parsable", *words], capture_output=True, text=True, env=env,
            cwd=folder, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    return sbatch


def job_processes(job: int, work: Path) -> list[int]:
    """The pids whose environment says they are `job`'s, submitted from `work` (this
    test's cluster: another test's job of the same id has another folder): the
    machine, not the database."""
    mine = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_SUBMIT_DIR={work}".encode()}
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:  # not a pid, or gone
            continue
        if mine <= env:
            found.append(int(entry))
    return found


async def test_sbatch_runs_the_script_on_the_first_node_and_its_srun_on_both(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    (work / "run.sh").write_text(SRUN.format(keys=state / "keys"))
    async with running_cluster(state, nats_url, database_url, db, nodes(2)) as cluster:
        sbatch = sbatch_in(work, cluster.nats_url, tmp_path / "bin")
        job = sbatch("run.sh")
        row = await eventually(
            lambda: db.fetchrow(ENDED, job, ENDS), lambda r: r is not None, 120.0
        )
        assert row is not None
        assert (row["state"], row["exit_code"]) == ("COMPLETED", 0)
        # the script ran once (on node01), its one srun on both nodes
        assert (work / f"slurm-{job}.out").read_text() == "batch on node01\nR0@node01\nR1@node02\n"
        steps = await db.fetch(
            "SELECT step_id, state, ntasks, nodes FROM job_steps WHERE job_id = $1", job
        )
        assert [tuple(s) for s in steps] == [(0, "COMPLETED", 2, ["node01", "node02"])]
        # node02's holder went with the script: nothing of the job is left on the machine
        await eventually(
            lambda: ready(job_processes(job, work)), lambda ps: ps == [], 30.0, "no process"
        )

        (work / "tasks.sh").write_text(TASKS.format(keys=state / "keys"))
        four = sbatch("tasks.sh")
        row = await eventually(lambda: db.fetchrow(ENDED, four, ENDS), lambda r: r is not None)
        assert row is not None and row["state"] == "COMPLETED"
        lines = "tasks 4\nmaster node01\nR0@node01\nR1@node01\nR2@node02\nR3@node02\n"
        assert (work / f"slurm-{four}.out").read_text() == lines

        (work / "gpus.sh").write_text(GPU_TASKS.format(keys=state / "keys"))
        bound = sbatch("gpus.sh")
        row = await eventually(lambda: db.fetchrow(ENDED, bound, ENDS), lambda r: r is not None)
        assert row is not None and row["state"] == "COMPLETED"
        head, *tasks = (work / f"slurm-{bound}.out").read_text().splitlines()
        job_gpus = head.rsplit(" ", 1)[1].split(",")
        assert head.startswith("per task 1, tasks 2, gpus ") and len(job_gpus) == 2, head
        # one GPU each, the job's, not the same one (before: both saw both GPUs)
        assert [t.split(" ")[0] for t in tasks] == ["R0", "R1"]
        assert sorted(t.split(" ")[1] for t in tasks) == sorted(job_gpus), tasks

        # the script's status is the job's, whatever the holders did
        failing = sbatch("-N", "2", "-t", "5", "--wrap", "echo once; exit 3")
        row = await eventually(
            lambda: db.fetchrow(ENDED, failing, ENDS), lambda r: r is not None, 120.0
        )
        assert row is not None
        assert (row["state"], row["exit_code"]) == ("FAILED", 3)
        assert (work / f"slurm-{failing}.out").read_text() == "once\n"
        await eventually(
            lambda: ready(job_processes(failing, work)), lambda p: p == [], 30.0, "none"
        )


async def test_an_srun_before_every_nodes_worker_started_waits_for_them(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """node02's site prolog takes 3 s, so node01's script (its worker started at once)
    calls srun while the job's run is still STARTING. Before, srun was refused "job J is
    not running" and the job FAILED with its status 1."""
    state, work = tmp_path / "state", tmp_path / "work"
    work.mkdir()
    (work / "run.sh").write_text(SRUN.format(keys=state / "keys"))
    prolog = tmp_path / "prolog.sh"
    prolog.write_text('#!/bin/sh\n[ "$SLURMD_NODENAME" = node02 ] && sleep 3\nexit 0\n')
    prolog.chmod(0o755)
    slow = {"MUSTER_PROLOG": str(prolog), "MUSTER_HOOK_TIMEOUT_S": "30"}
    async with running_cluster(state, nats_url, database_url, db, nodes(2), env=slow) as c:
        job = sbatch_in(work, c.nats_url, tmp_path / "bin")("run.sh")
        # node01's script waits in srun while node02's prolog runs: the probe sees it
        await eventually(lambda: ready(job_processes(job, work)), bool, 30.0, "the script")
        row = await eventually(
            lambda: db.fetchrow(ENDED, job, ENDS), lambda r: r is not None, 120.0
        )
        assert row is not None
        assert (row["state"], row["exit_code"]) == ("COMPLETED", 0)
        assert (work / f"slurm-{job}.out").read_text() == "batch on node01\nR0@node01\nR1@node02\n"
        said = (work / f"srun-{job}.err").read_text().splitlines()
        assert said[0].startswith(f"srun: job {job}: step creation temporarily disabled")
        assert f"job {job} is starting" in said[0]
        assert said[1:] == [f"srun: step created for job {job}"]
        await eventually(lambda: ready(job_processes(job, work)), lambda p: p == [], 30.0, "gone")
