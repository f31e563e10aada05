"""End to end on a running local cluster: a node agent runs only what the launcher
signed, never as a system account, from a spool the job's user cannot touch, with the
submitter's environment and none of the daemons'. Every refused attack is checked to
have left nothing: no process, no worker record, no spool folder, no database row; a
start the launcher did sign, run the same way, shows those checks would see one."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import msgspec
import pytest

from muster.client import agent, call
from muster.cluster import Cluster
from services.launcher.gang import launcher_signer
from services.launcher.worker_table import WorkerTable, node_state_folder
from shared.agent_auth import GrantSigner
from shared.api import AgentReply, StopWorkers, SubmitReply, SubmitRequest, WorkerSpec
from shared.identity import Signer, encode_seed
from tests.support.accounts import AccountUnavailable, run_as_account
from tests.support.cluster import eventually, job_state, nodes, open_folder, running_cluster

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent's run-as and spool need root"),
]

NODE = "node01"
JOB = 990_001  # no such job in the database: only an agent request could run it
DAEMON_ONLY = "MUSTERTEST_DAEMON_ONLY_SECRET"  # in the services' environment only


@pytest.fixture
async def cluster(
    nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Cluster]:
    # The job's user must reach the spool, as under /var/lib/muster.
    with open_folder("muster-agent-", 0o755) as state:
        async with running_cluster(
            state,
            nats_url,
            database_url,
            db,
            nodes(2),
            env={"MUSTERTEST_DAEMON_ONLY_SECRET": "leaked"},
        ) as c:
            yield c


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A folder the job's user may write."""
    with open_folder("muster-agent-work-", 0o777) as folder:
        yield folder


def start_of(workdir: Path, *, run_as: str | None, tag: str, generation: int = 0) -> WorkerSpec:
    """A start as an attacker writes one: its script leaves a mark if it ever runs."""
    script = (
        "#!/bin/bash\n"
        f'echo "$(id -u)" > {workdir}/ran-{tag}\n'
        f'touch "$(dirname "$0")/planted" 2> {workdir}/spool-{tag} ||'
        f" echo refused >> {workdir}/spool-{tag}\n"
        f"exec -a muster-attack-{tag} sleep 2\n"
    )  # fmt: skip
    return WorkerSpec(
        job_id=JOB, attempt=1, generation=generation, argv=("{spool}/script.sh",),
        env={"PATH": "/usr/bin:/bin"}, workdir=str(workdir), stdout=f"{workdir}/out-{tag}",
        stderr=f"{workdir}/out-{tag}", run_as=run_as, script=script,
    )  # fmt: skip


async def send(cluster: Cluster, verb: str, body: msgspec.Struct, node: str = NODE) -> AgentReply:
    raw = await agent(cluster.nats_url, node, verb, body, timeout=30)
    return msgspec.json.decode(raw, type=AgentReply)


def attack_processes(tag: str) -> list[int]:
    """Every process on this machine whose command line carries the attack's mark (ps)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue  # not a process, or gone meanwhile
        if entry.name.isdigit() and f"muster-attack-{tag}".encode() in cmdline:
            found.append(int(entry.name))
    return found


async def assert_nothing_ran(
    cluster: Cluster, db: asyncpg.Connection, workdir: Path, tag: str
) -> None:
    spool = cluster.state_dir / "spool" / NODE
    table = WorkerTable(node_state_folder(cluster.state_dir, NODE))
    assert not (workdir / f"ran-{tag}").exists()
    assert attack_processes(tag) == []
    assert [r for r in table.records() if r.job_id == JOB] == []
    assert sorted(p.name for p in spool.glob(f"job-{JOB}-*")) == []
    assert await db.fetchval("SELECT count(*) FROM worker_exits WHERE job_id = $1", JOB) == 0


async def test_an_agent_runs_only_what_the_launcher_signed_and_never_as_a_system_account(
    cluster: Cluster, db: asyncpg.Connection, workdir: Path
) -> None:
    launcher = launcher_signer(str(cluster.state_dir))
    assert launcher is not None
    intruder = GrantSigner(Signer(encode_seed(os.urandom(32))))
    now = time.time()
    as_root = start_of(workdir, run_as=None, tag="root")
    signed_elsewhere = launcher.sign(start_of(workdir, run_as=None, tag="other"), "node02", now=now)
    altered = msgspec.structs.replace(
        launcher.sign(start_of(workdir, run_as=None, tag="edit", generation=1), NODE, now=now),
        argv=("/bin/bash", "-c", "exec -a muster-attack-edit sleep 30"),
    )
    attacks = {
        "root": (as_root, "refused (unsigned)"),
        "forged": (intruder.sign(start_of(workdir, run_as=None, tag="forged"), NODE, now=now),
                   "refused (untrusted_key)"),
        "other": (signed_elsewhere, "refused (wrong_node)"),
        "edit": (altered, "refused (altered)"),
        "expired": (launcher.sign(start_of(workdir, run_as=None, tag="expired"), NODE,
                                  now=now - 3600), "refused (expired)"),
        "daemon": (launcher.sign(start_of(workdir, run_as="daemon", tag="daemon"), NODE, now=now),
                   "a system account"),
    }  # fmt: skip
    for tag, (body, want) in attacks.items():
        reply = await send(cluster, "start", body)
        assert not reply.ok and want in reply.message, (tag, reply)
        await assert_nothing_ran(cluster, db, workdir, tag)

    # The control: the launcher's own start of the same kind runs, as the job's user, from
    # a spool folder that user cannot write in, which is gone once the job ended.
    try:
        account = await asyncio.to_thread(run_as_account)
    except AccountUnavailable as why:
        pytest.skip(f"the control start needs a job account: {why}")
    good = launcher.sign(start_of(workdir, run_as=account.name, tag="good"), NODE, now=time.time())
    reply = await send(cluster, "start", good)
    assert reply.ok, reply
    ran = workdir / "ran-good"
    await eventually(lambda: asyncio.to_thread(ran.exists), bool, 30, "the signed start ran")
    assert (await asyncio.to_thread(ran.read_text)).strip() == str(account.uid)
    spool_note = workdir / "spool-good"
    # the note exists once the redirect opens it, before touch fails and the script
    # appends its verdict: wait for the verdict, not the file
    await eventually(
        lambda: asyncio.to_thread(lambda: spool_note.exists() and spool_note.read_text()),
        lambda text: "refused" in (text or ""),
        30,
        "the spool probe refused",
    )
    spool = cluster.state_dir / "spool" / NODE
    await eventually(
        lambda: asyncio.to_thread(lambda: list(spool.glob(f"job-{JOB}-*"))),
        lambda left: left == [], 30, "the spool folder removed after the job",
    )  # fmt: skip


async def test_a_job_has_the_submitters_environment_and_ignores_an_unsigned_stop(
    cluster: Cluster, db: asyncpg.Connection, workdir: Path
) -> None:
    script = "#!/bin/bash\nenv > env-$MUSTER_JOB_ID\nexec -a muster-attack-stop sleep 120\n"
    environment = {"PATH": os.environ["PATH"], "SUBMITTER_ONLY": "mine"}
    req = SubmitRequest(user="root", script=script, workdir=str(workdir), environment=environment)
    job_id = (await call(cluster.nats_url, "submit", req, SubmitReply)).job_ids[0]
    dump = workdir / f"env-{job_id}"
    await eventually(lambda: job_state(db, job_id), lambda s: s == "RUNNING", 60, "running")
    await eventually(lambda: asyncio.to_thread(dump.exists), bool, 30, "the job's env dump")
    await eventually(lambda: asyncio.to_thread(attack_processes, "stop"), bool, 30, "its process")
    text = await asyncio.to_thread(dump.read_text)
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert env.get("SUBMITTER_ONLY") == "mine"
    assert env.get("PATH") == os.environ["PATH"]
    assert DAEMON_ONLY not in env  # the launcher and agent have it; the job does not

    # An unsigned stop (anyone on the bus could send one) stops nothing.
    node = (await db.fetchval("SELECT nodes FROM job_runs WHERE job_id = $1", job_id))[0]
    reply = await send(cluster, "stop", StopWorkers(job_id=job_id, grace_s=0.1), node=node)
    assert not reply.ok and "refused (unsigned)" in reply.message
    assert attack_processes("stop") != []
    assert await job_state(db, job_id) == "RUNNING"
