"""End to end: Slurm's command names (`muster shims DIR`) driven as a Slurm user would,
against a local cluster — a script submitted with `sbatch --parsable`, found with
`squeue -h -o "%i %T"`, the nodes listed by `sinfo -N` (with their partition), put back
in the queue with `scontrol requeue` (it runs again, same id, restart count 1), a held
job changed with `scontrol update`, a node drained and resumed with `scontrol update
NodeName=`,
cancelled with `scancel`, its accounting read with `sacct`, its GPU time with `sreport`,
and `sbatch --wait` returning the job's exit code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from muster.cluster import Cluster
from tests.support.cluster import eventually, nodes, run_cli, running_cluster

pytestmark = pytest.mark.slow

LONG = "#!/bin/bash\n#SBATCH --job-name=shimmed\n#SBATCH --gpus-per-node=1 --time=5\nsleep 120\n"
FAILS = "#!/bin/bash\n#SBATCH --job-name=three --time=2\necho done; exit 3\n"


@pytest.fixture
async def cluster(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    async with running_cluster(tmp_path / "state", nats_url, database_url, db, nodes(2)) as c:
        yield c


def slurm(folder: Path, cluster: Cluster, *words: str) -> subprocess.CompletedProcess[str]:
    """One shim run as a user's shell runs it: found on PATH, in the job's folder."""
    env = {
        **os.environ,
        "PATH": f"{folder / 'bin'}:{os.environ['PATH']}",
        "MUSTER_NATS_URL": cluster.nats_url,
    }
    return subprocess.run(
        list(words), capture_output=True, text=True, env=env, cwd=folder, timeout=120
    )


async def test_sbatch_squeue_sinfo_scancel_and_sacct_work_as_slurm_users_type_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    wrote = run_cli("shims", str(tmp_path / "bin"), env={})
    assert wrote.returncode == 0, wrote.stderr
    (tmp_path / "long.sh").write_text(LONG)
    (tmp_path / "fails.sh").write_text(FAILS)

    def run(*words: str) -> subprocess.CompletedProcess[str]:
        out = slurm(tmp_path, cluster, *words)
        assert "Traceback" not in out.stderr, out.stderr
        return out

    async def shell(*words: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(run, *words)

    checked = await shell("sbatch", "--test-only", "long.sh")  # checked, nothing stored
    assert checked.returncode == 0 and "Job would be accepted: 1 node(s), 1 GPU(s) per" in (
        checked.stderr
    ), checked.stderr
    assert (await shell("squeue", "-h", "-t", "all")).stdout == ""
    sub = await shell("sbatch", "--parsable", "long.sh")
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip()
    assert job.isdigit(), sub.stdout

    await eventually(  # --me in a shell with no $USER (cron, a container): the key's user
        lambda: shell("env", "-u", "USER", "-u", "LOGNAME", "squeue", "--me", "-h", "-o", "%i %T"),
        lambda out: out.stdout.split() == [job, "RUNNING"],
        timeout=60,
        what="squeue --me shows the job RUNNING",
    )
    info = await shell("sinfo", "-N", "-h", "-o", "%N %T")
    assert sorted(info.stdout.split()) == sorted(["node01", "node02", "idle", "mixed"]), info.stdout
    parts = await shell("sinfo", "-h", "-o", "%P %D")
    assert parts.stdout.split() == ["normal*", "1", "normal*", "1"], parts.stdout  # by state
    long = (await shell("sinfo", "-l")).stdout.splitlines()  # the time read, then columns
    assert long[1].split()[:4] == ["PARTITION", "AVAIL", "TIMELIMIT", "JOB_SIZE"], long
    queued = (await shell("squeue", "-l", "-j", job)).stdout.splitlines()
    assert queued[2].split()[4] == "RUNNING", queued

    requeue = await shell("scontrol", "requeue", job)
    assert requeue.returncode == 0, requeue.stderr

    async def restarts() -> list[tuple[str, int]]:
        out = await shell("squeue", "-j", job, "--json")
        return [(j["job_state"][0], j["restart_cnt"]) for j in json.loads(out.stdout)["jobs"]]

    await eventually(restarts, lambda got: got == [("RUNNING", 1)], 60, "requeued, running again")

    cancel = await shell("scancel", job)
    assert (cancel.returncode, cancel.stdout) == (0, ""), cancel.stderr
    await eventually(
        lambda: shell("squeue", "-h", "-t", "all", "-j", job, "-o", "%i %T"),
        lambda out: out.stdout.split() == [job, "CANCELLED"],
        timeout=60,
        what="the job CANCELLED",
    )
    acct = await eventually(
        lambda: shell("sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,JobName,State"),
        lambda out: out.stdout.startswith(f"{job}|shimmed|CANCELLED"),
        timeout=60,
        what="sacct records the cancel",
    )
    assert acct.returncode == 0
    # seff: the job's report (what it used needs a cgroup: test_isolation); a step, a
    # task of an array by ARRAY_TASK, as seff is typed
    seff = await shell("seff", job)
    assert seff.returncode == 0 and f"Job ID: {job}\n" in seff.stdout, seff
    assert "State: CANCELLED" in seff.stdout, seff.stdout
    step = await shell("seff", f"{job}.0")
    assert step.returncode == 1 and "seff reports a job, not a step" in step.stderr
    array = (await shell("sbatch", "--parsable", "-H", "--array=0-1", "long.sh")).stdout.strip()
    own = (await shell("squeue", "-h", "-r", "-j", f"{array}_1", "-o", "%A")).stdout.strip()
    task = await shell("seff", f"{array}_1")
    assert task.returncode == 0 and f"Job ID: {own}\n" in task.stdout, (own, task)
    assert own != array.split(";")[0], own  # the task's own id, not the array's first
    # and sacct: a task by ARRAY_TASK, the whole array by its id
    by_task = await shell("sacct", "-j", f"{array}_1", "-X", "-n", "-P", "-o", "JobID")
    assert by_task.stdout.split() == [own], (own, by_task)
    every = await shell("sacct", "-j", array, "-X", "-n", "-P", "-o", "JobID")
    assert len(every.stdout.split()) == 2 and own in every.stdout.split(), every
    records = (await shell("scontrol", "-o", "show", "job", array)).stdout.split("\n\n")
    assert [r.split()[0] for r in records if r.strip()] == [
        f"JobId={j}" for j in every.stdout.split()
    ], records  # an array's id: every task, as Slurm's scontrol
    await shell("scancel", array)
    # the GPU time the job used, charged by the hour, in sreport's chargeback report:
    # the submitter's row once charged (a second or two of one GPU: Used may round to 0)
    window = (f"start={time.time() - 3600:.0f}", f"end={time.time() + 3600:.0f}")
    report = await eventually(
        lambda: shell("sreport", "-P", "-n", "-t", "seconds", "cluster",
                      "AccountUtilizationByUser", *window),
        lambda out: out.returncode == 0 and any(
            line.split("|")[2] == "root" for line in out.stdout.splitlines()
        ),
        timeout=60,
        what="sreport has the job's GPU time",
    )  # fmt: skip
    rows = [line.split("|") for line in report.stdout.splitlines()]
    assert rows[0][:3] == ["muster", "root", ""], rows  # the whole window first
    accounts = [r for r in rows[1:] if r[2] == ""]
    assert [r[1] for r in accounts] == ["default"] and accounts[0][4] == rows[0][4], rows
    top = await shell("sreport", "-P", "-n", "-t", "seconds", "user", "TopUsage", *window)
    assert top.returncode == 0, top.stderr
    assert [line.split("|")[1:4] for line in top.stdout.splitlines()] == [
        ["root", "", "default"]
    ], top.stdout  # the submitter's one association, as TopUsage names it

    # a held job changed in place: same id, its new limit and name shown; its nodes and
    # GPUs too, and once released it is placed by them; what this shim does not change
    # is refused, saying what to do
    held = (await shell("sbatch", "--parsable", "-H", "long.sh")).stdout.strip()
    start = await shell("squeue", "--start", "-h")  # pending jobs alone, with their starts
    assert start.stdout.split() == [held, "normal", "shimmed", *start.stdout.split()[3:4],
                                    "PD", "N/A", "1", "(JobHeldUser)"], start.stdout  # fmt: skip
    changed = await shell(
        "scontrol", "update", f"JobId={held}", "TimeLimit=10:00", "JobName=renamed"
    )
    assert changed.returncode == 0, changed.stderr
    shown = (await shell("scontrol", "show", "job", held)).stdout
    assert "JobName=renamed" in shown and "TimeLimit=0:10:00" in shown, shown
    # `-o`: a record a line, each value one word, as `grep -oP 'Reason=\K\S+'` reads it
    one = (await shell("scontrol", "-o", "show", "job", held)).stdout.splitlines()
    assert len(one) == 2 and one[1] == "" and " Reason=JobHeldUser " in one[0], one
    part = (await shell("scontrol", "show", "partition", "normal")).stdout
    assert "PartitionName=normal" in part and "State=UP" in part, part
    # sprio: once fairshare has ranked it, its priority and factors, Slurm's columns
    ranked = await eventually(
        lambda: shell("sprio", "-h", "-j", held, "-o", "%i %Y %F"),
        lambda out: out.stdout.split()[:1] == [held],
        timeout=30,
        what="sprio lists the held job",
    )
    assert int(ranked.stdout.split()[1]) >= int(ranked.stdout.split()[2]), ranked.stdout
    wider = await shell("scontrol", "update", f"JobId={held}", "NumNodes=2", "Gres=gpu:2")
    assert wider.returncode == 0, wider.stderr
    pinned = await shell("scontrol", "update", f"JobId={held}", "ReqNodeList=node[01-02]")
    assert pinned.returncode == 0, pinned.stderr
    tasks = await shell("scontrol", "update", f"JobId={held}", "NumTasks=4")
    assert tasks.returncode != 0 and "cancel the job and submit it again" in tasks.stderr
    assert (await shell("scontrol", "release", held)).returncode == 0
    await eventually(
        lambda: shell("squeue", "-h", "-j", held, "-o", "%T %D %b"),
        lambda out: out.stdout.split() == ["RUNNING", "2", "gres/gpu:2"],
        timeout=60,
        what="the job running on two nodes of two GPUs",
    )
    await shell("scancel", held)

    # an operator drains a node in Slurm's words, and resumes it
    async def node02() -> str:
        out = await shell("sinfo", "-N", "-h", "-o", "%N %T")
        return dict(line.split() for line in out.stdout.splitlines()).get("node02", "")

    unsaid = await shell("scontrol", "update", "NodeName=node02", "State=DRAIN")
    assert unsaid.returncode != 0 and "a drain says why" in unsaid.stderr, unsaid.stderr
    drain = await shell("scontrol", "update", "NodeName=node02", "State=DRAIN", "Reason=riser")
    assert (drain.returncode, drain.stdout) == (0, ""), drain.stderr
    await eventually(node02, lambda s: s in ("drained", "draining"), 30, "node02 drained")
    listed = await shell("sinfo", "-R", "-h", "-o", "%E|%u|%N")  # why, by whom: Slurm's -R
    assert listed.stdout.strip() == "riser|root|node02", listed.stdout
    resume = await shell("scontrol", "update", "NodeName=node02", "State=RESUME")
    assert resume.returncode == 0, resume.stderr
    await eventually(node02, lambda s: s in ("idle", "mixed", "allocated"), 30, "node02 back")

    waited = await shell("sbatch", "--wait", "fails.sh")
    assert waited.returncode == 3, (waited.stdout, waited.stderr)
    assert waited.stdout.startswith("Submitted batch job ")


TRAPS = """#!/bin/bash
#SBATCH --job-name=traps --time=2
trap 'echo "got USR1"' USR1
for i in $(seq 120); do sleep 0.5; done
"""
# the checkpoint idiom: the training process, an srun step, traps the signal
STEP_TRAPS = f"""#!/bin/bash
#SBATCH --job-name=steps --time=2
export MUSTER_KEY_DIR={{keys}}
{sys.executable} -m muster.shims srun bash -c \
    'trap "echo task got USR1" USR1; for i in $(seq 120); do sleep 0.5; done'
"""


async def test_scancel_s_signals_the_running_script(cluster: Cluster, tmp_path: Path) -> None:
    """`scancel -b -s USR1 JOB` (the checkpoint-then-requeue idiom) reaches the script's
    trap and cancels nothing. Before, admission asked the node's agent itself; the agent
    takes a stop only signed by the launcher, so it refused, and scancel said nothing of
    it (the job never got the signal)."""
    assert run_cli("shims", str(tmp_path / "bin"), env={}).returncode == 0
    (tmp_path / "traps.sh").write_text(TRAPS)

    async def shell(*words: str) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(slurm, tmp_path, cluster, *words)

    async def trapped(
        script: str, up: list[str], scancel: list[str], said: str, step: str = ""
    ) -> None:
        """Submit `script`; once `squeue ... up` prints the job's id, signal it with
        `scancel ... JOB` (`JOB.STEP` with `step`); its output then says `said`, and it
        runs on (not cancelled)."""
        job = (await shell("sbatch", "--parsable", script)).stdout.strip()
        await eventually(
            lambda: shell("squeue", "-h", "-j", job, *up, "-o", "%i"),
            lambda out: out.stdout.strip() in (job, f"{job}.0"),
            timeout=60,
            what=f"{script} running",
        )
        sent = await shell("scancel", *scancel, job + step)
        assert (sent.returncode, sent.stderr) == (0, ""), sent.stderr
        out = tmp_path / f"slurm-{job}.out"
        await eventually(
            lambda: asyncio.to_thread(lambda: out.read_text() if out.exists() else ""),
            lambda text: said in text,
            timeout=30,
            what=f"{said!r} from {script}",
        )
        state = await shell("squeue", "-h", "-j", job, "-o", "%T")
        assert state.stdout.strip() == "RUNNING", (state.stdout, out.read_text())
        await shell("scancel", job)

    await trapped("traps.sh", ["-t", "R"], ["-b", "-s", "USR1"], "got USR1")
    # without -b, as Slurm's: the job's steps. Before, the script's group got it: the
    # script (no trap) and srun died, the job FAILED, the step's task never heard it.
    (tmp_path / "steps.sh").write_text(STEP_TRAPS.format(keys=cluster.state_dir / "keys"))
    await trapped("steps.sh", ["-s"], ["-s", "USR1"], "task got USR1")
    # one step by its id: its tasks alone (before: refused, "signal its job")
    await trapped("steps.sh", ["-s"], ["-s", "USR1"], "task got USR1", step=".0")
