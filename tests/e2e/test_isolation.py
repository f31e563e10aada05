"""End to end, as root on this machine's real cgroups: a job's cgroup holds it to its
--mem (OUT_OF_MEMORY with the peak), to the node's pids limit, to its own GPUs' device
nodes (mknod stand-ins of /dev/nvidia0..3) and to its account's I/O settings (read
back from its cgroup files); a failing prolog drains the node and requeues the job; the
epilog runs after a cancel. Every cgroup a test's cluster made is gone after it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from muster.client import call
from services.launcher import cgroups
from shared.api import JobSelector, Ok, ShowJobReply, ShowJobRequest
from tests.support.cluster import (
    eventually,
    job_state,
    nodes,
    ready,
    run_cli,
    running_cluster,
    submit,
)

pytestmark = pytest.mark.slow

HIERARCHY = cgroups.detect()
CONTROLLERS = ("memory", "pids", "devices", "blkio")


def _missing() -> str | None:
    """Why this machine cannot run these tests, naming what it lacks; None if it can."""
    if os.geteuid() != 0:
        return "needs root: cgroups are made and jobs confined by a root agent"
    if HIERARCHY is None:
        return "no usable memory cgroup controller on this machine"
    if HIERARCHY.version.value == "v1":
        lacking = [c for c in CONTROLLERS if c not in HIERARCHY.mounts]
        if lacking:
            return f"cgroup v1 controller(s) not mounted: {', '.join(lacking)}"
    else:
        return "cgroup v2 here: device confinement needs BPF (not built); run on v1"
    return None


MISSING = _missing()
needs_cgroups = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

CONFIG = """
[cluster]
default_partition = "normal"
[partitions.normal]
nodes = ["ALL"]
io_weight = 300
[accounts.root]
shares = 1
[accounts.ckpt]
parent = "root"
shares = 1
io_weight = 50
io_write_bps = 1048576
[accounts.infer]
parent = "root"
shares = 1
io_read_bps = 2097152
[users.root]
accounts = ["ckpt", "infer"]
[roles]
operators = ["root"]
"""

HOG = """#!/bin/bash
python3 -c 'x = bytearray(400 * 2**20); print("survived")'
"""

FORKS = """#!/bin/bash
python3 - <<'EOF'
import os, signal
kids = []
try:
    for _ in range(200):
        pid = os.fork()
        if pid == 0:
            signal.pause()
        kids.append(pid)
except OSError as err:
    print("refused after", len(kids), err.errno)
for pid in kids:
    os.kill(pid, 9)
EOF
"""

DEVICES = """#!/bin/bash
python3 - "$1" <<'EOF'
import json, os, sys
got = {}
for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"):
    try:
        os.close(os.open(os.path.join(sys.argv[1], name), os.O_RDWR))
        got[name] = 0
    except OSError as err:
        got[name] = err.errno
print("devices", json.dumps(got), os.environ["CUDA_VISIBLE_DEVICES"])
EOF
"""

IO = """#!/bin/bash
rel=$(sed -n 's/^[0-9]*:blkio:\\(.*\\)/\\1/p' /proc/self/cgroup)
d=/sys/fs/cgroup/blkio$rel
echo "cgroup $rel"
echo "write $(cat $d/blkio.throttle.write_bps_device)"
echo "read $(cat $d/blkio.throttle.read_bps_device)"
echo "weight $(cat $d/blkio.bfq.weight 2>/dev/null || echo absent)"
"""

SLEEPER = "#!/bin/bash\nsleep 300\n"
# A start that times out on a loaded machine requeues the job elsewhere (two nodes, so
# there is an elsewhere): wait for how it finally ended, not for the requeue.
TERMINAL = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def _root_dirs(root: str) -> list[Path]:
    assert HIERARCHY is not None
    return [
        Path(HIERARCHY.mounts[c], HIERARCHY.own.get(c, "/").lstrip("/"), root)
        for c in ("memory", "cpu", "cpuacct", "pids", "devices", "blkio")
        if c in HIERARCHY.mounts
    ]


def _job_cgroups(root: str) -> list[Path]:
    return [child for top in _root_dirs(root) if top.exists() for child in top.glob("*/")]


@contextlib.contextmanager
def cgroup_root() -> Iterator[str]:
    """A muster root of this test's own; whatever is left under it is killed and
    removed afterwards, the test failing or not."""
    name = f"muster-e2e-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        assert HIERARCHY is not None
        for child in _job_cgroups(name):
            ctl = next(c for c in HIERARCHY.mounts if str(child).startswith(HIERARCHY.mounts[c]))
            cgroups.remove(cgroups.CgroupRef(version=HIERARCHY.version, dirs={ctl: str(child)}))
        for top in _root_dirs(name):
            with contextlib.suppress(FileNotFoundError):
                top.rmdir()


def stand_in_gpus(folder: Path) -> None:
    """Character devices of the nvidia major standing in for a node's GPUs."""
    folder.mkdir()
    for minor in range(4):
        os.mknod(folder / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    os.mknod(folder / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))


async def _ended(db: asyncpg.Connection, job_id: int) -> tuple[str, str]:
    row = await eventually(
        lambda: db.fetchrow("SELECT state, reason FROM job_runs WHERE job_id = $1", job_id),
        lambda r: r is not None and r["state"] in TERMINAL,
        90,
        f"job {job_id} ended",
    )
    assert row is not None
    return row["state"], row["reason"]


def _output(workdir: Path, job_id: int) -> str:
    return (workdir / f"slurm-{job_id}.out").read_text()


@needs_cgroups
async def test_a_jobs_cgroup_holds_it_to_its_memory_pids_gpus_and_io_and_goes_when_it_ends(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text(CONFIG)
    gpus = tmp_path / "dev"
    stand_in_gpus(gpus)
    work = tmp_path / "work"
    work.mkdir()
    with cgroup_root() as root:
        async with running_cluster(
            tmp_path / "state",
            nats_url,
            database_url,
            db,
            nodes(2),
            env={
                "MUSTER_CLUSTER_CONFIG": str(config),
                "MUSTER_CGROUP_ROOT": root,
                "MUSTER_CGROUPS": "required",
                "MUSTER_JOB_PIDS_MAX": "40",
                "MUSTER_GPU_DEVICE_TEMPLATE": str(gpus / "nvidia{index}"),
                "MUSTER_IO_DEVICES": "/dev/loop0",
            },
        ) as cluster:
            url, wd = cluster.nats_url, str(work)
            hog = (await submit(url, HOG, ("--mem=100M",), workdir=wd)).job_ids[0]
            forks = (await submit(url, FORKS, (), workdir=wd)).job_ids[0]
            dev = (
                await submit(url, DEVICES, ("--gpus-per-node=1",), workdir=wd, args=(str(gpus),))
            ).job_ids[0]
            ckpt = (await submit(url, IO, ("-A", "ckpt"), workdir=wd)).job_ids[0]
            infer = (await submit(url, IO, ("-A", "infer"), workdir=wd)).job_ids[0]

            state, reason = await _ended(db, hog)
            assert state == "OUT_OF_MEMORY", reason
            assert "out of memory (peak 100 MiB)" in reason
            assert "survived" not in _output(work, hog).splitlines()

            assert (await _ended(db, forks))[0] == "COMPLETED"
            refused = _output(work, forks).splitlines()[-1].split()
            assert refused[:2] == ["refused", "after"], refused
            assert int(refused[2]) < 40 and int(refused[3]) == errno.EAGAIN

            assert (await _ended(db, dev))[0] == "COMPLETED"
            line = [x for x in _output(work, dev).splitlines() if x.startswith("devices")][-1]
            payload, own_index = line.removeprefix("devices ").rsplit(" ", 1)
            opened, own = json.loads(payload), int(own_index)
            for index in range(4):  # a stand-in has no driver: allowed ones end in ENXIO
                want = errno.ENXIO if index == own else errno.EPERM
                assert opened[f"nvidia{index}"] == want, (index, own, opened)
            assert opened["nvidiactl"] == errno.ENXIO

            for job, write, read in ((ckpt, "7:0 1048576", ""), (infer, "", "7:0 2097152")):
                assert (await _ended(db, job))[0] == "COMPLETED"
                out = _output(work, job)
                assert f"write {write}".strip() in out and f"read {read}".strip() in out, out
                weight = out.split("weight ", 1)[1].split()[0]
                assert weight in ("absent", "50" if job == ckpt else "300"), out
            show = await call(url, "show", ShowJobRequest(user="root", job_id=ckpt), ShowJobReply)
            assert (show.spec["io_weight"], show.spec["io_write_bps"]) == (50, 1048576)

            # Every worker's cgroup went with it.
            assert await eventually(lambda: ready(_job_cgroups(root)), lambda x: x == [], 30) == []


PROLOG = """#!/bin/sh
if [ "$SLURM_JOB_NAME" = bad-prolog ]; then echo "pkey 0x8001 not on this HCA"; exit 3; fi
exit 0
"""

EPILOG = """#!/bin/sh
echo "$SLURM_JOB_ID $SLURMD_NODENAME $SLURM_JOB_USER $CUDA_VISIBLE_DEVICES" >> {log}
"""


@needs_cgroups
async def test_a_failing_prolog_drains_the_node_and_requeues_and_the_epilog_runs_after_a_cancel(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    prolog, epilog, log = tmp_path / "prolog.sh", tmp_path / "epilog.sh", tmp_path / "epilog.log"
    prolog.write_text(PROLOG)
    epilog.write_text(EPILOG.format(log=log))
    for hook in (prolog, epilog):
        hook.chmod(0o755)
    with cgroup_root() as root:
        async with running_cluster(
            tmp_path / "state",
            nats_url,
            database_url,
            db,
            nodes(2),
            env={
                "MUSTER_CGROUP_ROOT": root,
                "MUSTER_PROLOG": str(prolog),
                "MUSTER_EPILOG": str(epilog),
                "MUSTER_HOOK_TIMEOUT_S": "20",
            },
        ) as cluster:
            url = cluster.nats_url
            # The epilog after a cancel (first: a start that times out under load can
            # still requeue this job to the other node, before any node is drained).
            ok = (
                await submit(url, SLEEPER, ("--gpus-per-node=2",), workdir=str(tmp_path))
            ).job_ids[0]
            await eventually(lambda: job_state(db, ok), lambda s: s == "RUNNING", 60, "running")
            await call(url, "cancel", JobSelector(user="root", job_ids=(ok,)), Ok)
            await eventually(lambda: job_state(db, ok), lambda s: s == "CANCELLED", 30)
            ran = await eventually(
                lambda: ready(log.read_text() if log.exists() else ""), lambda t: bool(t), 30
            )
            job, node_name, user, devices = str(ran).splitlines()[-1].split()
            assert (job, user, len(devices.split(","))) == (str(ok), "root", 2)
            assert node_name in ("node01", "node02")

            argv = ("-J", "bad-prolog", "-w", "node02")
            bad = (await submit(url, SLEEPER, argv, workdir=str(tmp_path))).job_ids[0]
            node = await eventually(
                lambda: db.fetchrow("SELECT state, reason FROM nodes WHERE name = 'node02'"),
                lambda r: r is not None and r["state"] in ("DRAINING", "DRAINED"),
                60,
                "node02 drained by the prolog",
            )
            assert node is not None
            assert "prolog" in node["reason"] and "pkey 0x8001" in node["reason"], node
            requeued = await eventually(
                lambda: db.fetchrow(
                    "SELECT a.outcome, r.state FROM attempts a JOIN job_runs r"
                    " USING (job_id) WHERE job_id = $1 AND a.outcome IS NOT NULL",
                    bad,
                ),
                lambda r: r is not None and r["state"] in ("REQUEUED", "PENDING"),
                30,
                "the bad job requeued",
            )
            assert requeued is not None  # the prolog's failure, or a start that timed out
            assert requeued["outcome"].startswith("requeue: could not start on node02")
            assert await eventually(lambda: ready(_job_cgroups(root)), lambda x: x == [], 30) == []


USES_128M = """#!/bin/bash
python3 -c 'x = bytearray(128 * 2**20); import time; time.sleep(0.5)'
"""


@needs_cgroups
async def test_sacct_and_seff_give_a_jobs_memory_peak_against_its_mem(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> None:
    """A job asking 512M that touches 128 MiB: its cgroup's peak and CPU time, recorded
    as its worker exits, are sacct's MaxRSS (on the node it ran on) and TotalCPU, and
    seff's memory and CPU efficiency."""
    work = tmp_path / "work"
    work.mkdir()
    with cgroup_root() as root:
        async with running_cluster(
            tmp_path / "state", nats_url, database_url, db, nodes(1),
            env={"MUSTER_CGROUP_ROOT": root, "MUSTER_CGROUPS": "required"},
        ) as cluster:  # fmt: skip
            job = (
                await submit(cluster.nats_url, USES_128M, ("--mem=512M",), workdir=str(work))
            ).job_ids[0]
            state, reason = await _ended(db, job)
            assert state == "COMPLETED", reason
            assert run_cli("shims", str(tmp_path / "bin"), env={}).returncode == 0
            env = {
                **os.environ,
                "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
                "MUSTER_NATS_URL": cluster.nats_url,
            }

            def shell(*words: str) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    words, capture_output=True, text=True, env=env, timeout=60, check=False
                )

            fields = "JobID,ReqMem,MaxRSS,MaxRSSNode,State,TotalCPU"
            acct = await asyncio.to_thread(
                shell, "sacct", "-j", str(job), "-X", "-P", "-n", f"--format={fields}"
            )
            assert acct.returncode == 0, acct.stderr
            jid, asked, rss, where, ended, cpu = acct.stdout.strip().split("|")
            assert (jid, asked, where, ended) == (str(job), "512M", "node01", "COMPLETED")
            assert 128 * 1024 <= int(rss.removesuffix("K")) < 512 * 1024, rss
            minutes, seconds = cpu.split(":")  # MM:SS.mmm: python's start and the memset
            assert 0 < int(minutes) * 60 + float(seconds) < 60, cpu
            seff = await asyncio.to_thread(shell, "seff", str(job))
            assert seff.returncode == 0, seff.stderr
            shown = await asyncio.to_thread(shell, "scontrol", "show", "job", str(job))
            assert f"MaxRSS={rss} MaxRSSNode=node01 TotalCPU={cpu}" in shown.stdout, shown
            lines = dict(line.split(": ", 1) for line in seff.stdout.splitlines())
            assert lines["Job ID"] == str(job)
            assert lines["CPU Efficiency"].endswith("core-walltime"), seff.stdout
            assert lines["Memory Efficiency"].endswith("% of 512.00 MB"), seff.stdout
            share = float(lines["Memory Efficiency"].split("%")[0])
            assert 25.0 <= share < 100.0, seff.stdout
