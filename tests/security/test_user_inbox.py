"""Users' private replies on a secured bus (tests/support/secure.py: the servers as
`muster up` starts them): each user connects with their own key and may read only
`_INBOX.<user>.>`, so alice can subscribe neither to bob's inboxes nor to `_INBOX.>`, and
a reply to bob never reaches her; each gets their own replies through the CLI (lean and
full); a key registered while the cluster runs connects once admission has rendered it
into the bus's authorization and the server reloaded, and a removed one is refused (its
open connection closed)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from muster.client import signed
from shared.api import API_PREFIX, Envelope, QueueReply, QueueRequest
from shared.identity_files import load_signer
from shared.security import nats_options
from tests.support.cluster import eventually, nodes, run_cli
from tests.support.secure import Secured, secured_cluster

pytestmark = pytest.mark.slow

SCRIPT = "#!/bin/bash\nsleep 300\n"


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    with secured_cluster(nodes(1, gpus=2)) as s:
        yield s


class Listener:
    """A user's connection that keeps the errors the server sends it and what arrives."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.got: list[Msg] = []
        self.nc: Client | None = None

    async def connect(self, secured: Secured, user: str, key: str = "") -> Client:
        async def on_error(err: Exception) -> None:
            self.errors.append(str(err).lower())

        self.nc = await nats.connect(
            secured.nats_url,
            allow_reconnect=False,
            error_cb=on_error,
            **nats_options(key or secured.user_key(user), inbox_prefix=f"_INBOX.{user}"),
        )
        return self.nc

    async def listen(self, subject: str) -> None:
        async def keep(msg: Msg) -> None:
            self.got.append(msg)

        assert self.nc is not None
        await self.nc.subscribe(subject, cb=keep)

    async def refused(self, subject: str) -> None:
        await eventually(
            lambda: asyncio.sleep(0, self.errors),
            lambda errs: any("permissions violation" in e and subject.lower() in e for e in errs),
            what=f"a permissions violation for {subject}",
        )


async def ask_queue(nc: Client, user: str) -> QueueReply:
    msg = await nc.request(API_PREFIX + "queue", signed("queue", QueueRequest(user=user)), 15)
    env = msgspec.json.decode(msg.data, type=Envelope)
    assert env.error is None, env.error
    return msgspec.json.decode(env.ok, type=QueueReply)


async def test_a_user_reads_neither_another_users_inbox_nor_every_inbox(secured: Secured) -> None:
    alice, bob = Listener(), Listener()
    await alice.connect(secured, "alice")
    await bob.connect(secured, "bob")
    assert alice.nc is not None and bob.nc is not None
    try:
        for subject in ("_INBOX.bob.>", "_INBOX.>"):
            await alice.listen(subject)
            await alice.refused(subject)
        await ask_queue(bob.nc, "bob")  # a reply to bob, sent while alice "listens"
        await alice.nc.flush()
        assert alice.got == []
        # alice's own inbox is hers, and her requests are answered there
        await ask_queue(alice.nc, "alice")
    finally:
        await alice.nc.close()
        await bob.nc.close()


def cli(secured: Secured, user: str, *args: str, lean: bool = True, **env: str) -> str:
    env = {"MUSTER_NATS_URL": secured.nats_url, "MUSTER_USER": user, **env}
    if not lean:
        env["MUSTER_NO_LEAN"] = "1"  # the full command (argparse, msgspec, nats-py's path)
    out = run_cli(*args, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_alice_and_bob_each_get_their_own_replies_through_the_cli(
    secured: Secured, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    ids = {}
    for user in ("alice", "bob"):
        out = cli(secured, user, "submit", "--hold", str(script), CWD=str(tmp_path))
        ids[user] = out.split()[-1]
    for user, other in (("alice", "bob"), ("bob", "alice")):
        for lean in (True, False):
            shown = cli(secured, user, "queue", lean=lean)
            jobs = [line.split()[0] for line in shown.splitlines()[1:] if line.strip()]
            assert ids[user] in jobs and ids[other] not in jobs, (user, lean, shown)


async def test_a_key_added_at_runtime_connects_and_a_removed_one_is_refused(
    secured: Secured, tmp_path: Path
) -> None:
    key = tmp_path / "erin.nk"
    made = run_cli("keygen", "--file", str(key), env={"HOME": str(tmp_path)})
    assert made.returncode == 0, made.stderr
    public = load_signer(str(key)).public_key
    config = os.environ["MUSTER_CLUSTER_CONFIG"]  # the cluster's (tests/support/cluster.py)
    erin = str(key)

    async def connects() -> bool:
        try:
            nc = await nats.connect(
                secured.nats_url, allow_reconnect=False, **nats_options(str(key))
            )
        except Exception:  # refused: not (or no longer) in the bus's authorization
            return False
        await nc.close()
        return True

    assert not await connects()
    out = run_cli(
        "queue",
        env={"MUSTER_NATS_URL": secured.nats_url, "MUSTER_USER": "erin", "MUSTER_KEY_FILE": erin},
    )
    assert out.returncode == 1 and "not registered" in out.stderr, out.stderr

    added = run_cli("user", "add", "erin", "--key", public, "--config", config, env={})
    assert added.returncode == 0, added.stderr
    await eventually(connects, bool, 60, "erin's new key let onto the bus")
    cli(secured, "erin", "queue", MUSTER_KEY_FILE=erin)  # answered on erin's own inbox

    held = Listener()
    await held.connect(secured, "erin", str(key))
    assert held.nc is not None
    try:
        removed = run_cli("user", "remove-key", "erin", "--key", public, "--config", config, env={})
        assert removed.returncode == 0, removed.stderr
        await eventually(connects, lambda ok: not ok, 60, "erin's removed key refused")
        await eventually(
            lambda: asyncio.sleep(0, held.nc), lambda nc: nc is None or nc.is_closed, 60,
            "erin's open connection closed",
        )  # fmt: skip
    finally:
        await held.nc.close()


async def test_a_users_terminal_is_hers_alone_and_srun_pty_works_on_a_secured_bus(
    secured: Secured, tmp_path: Path
) -> None:
    """`srun --pty` relays on `muster.pty.<user>.<hex>` (shared/bus_inbox.py): alice types
    on and reads her own terminal subjects, the node's agent writes to them, and neither
    of bob's is open to her; then a real `srun --pty` into a running job, whose output
    crossed the bus on its user's subjects."""
    alice = Listener()
    nc = await alice.connect(secured, "alice")
    mine, bobs = "muster.pty.alice." + "ab" * 16, "muster.pty.bob." + "cd" * 16
    await alice.listen(mine + ".out")
    await nc.publish(mine + ".in", b"typed")
    await nc.flush()
    node = await nats.connect(
        secured.nats_url,
        allow_reconnect=False,
        **nats_options(secured.creds("node-node01"), inbox_prefix="_I.node-node01"),
    )
    try:
        await node.publish(mine + ".out", b"printed")
        await node.flush()
        await eventually(
            lambda: asyncio.sleep(0, [m.data for m in alice.got]),
            lambda got: got == [b"printed"],
            what="the agent's terminal output at alice",
        )
        assert alice.errors == []
        await alice.listen(bobs + ".out")
        await alice.refused(bobs + ".out")
        await nc.publish(bobs + ".in", b"typed")
        await alice.refused(bobs + ".in")
    finally:
        await node.close()
        await nc.close()

    # a job of root's (no account alice on this machine runs jobs): its own terminal
    script = tmp_path / "hold.sh"
    script.write_text("#!/bin/bash\nsleep 300\n")
    job = cli(secured, "root", "submit", str(script), CWD=str(tmp_path)).split()[-1]
    try:
        await eventually(
            lambda: asyncio.to_thread(cli, secured, "root", "queue"),
            lambda shown: any(
                line.split()[:1] == [job] and " RUNNING " in line for line in shown.splitlines()
            ),
            what=f"job {job} RUNNING",
            timeout=60,
        )
        # srun's stdin, a pipe, is sent at once, before the relay listens: srun asks
        # again until the relay answers (muster/pty_keys.py), which its user may ask
        typed = run_cli(
            "srun", "--jobid", job, "--pty", "sh", "-c",
            "read k; echo pty-$k-$SLURM_PROCID-$SLURMD_NODENAME",
            env={"MUSTER_NATS_URL": secured.nats_url, "MUSTER_USER": "root", "CWD": str(tmp_path)},
            stdin="early\n",
        )  # fmt: skip
        assert typed.returncode == 0, typed.stderr
        assert "pty-early-0-node01" in typed.stdout, typed.stdout
    finally:
        cli(secured, "root", "cancel", job)


async def test_a_jobs_own_srun_runs_a_step_on_a_secured_bus(
    secured: Secured, tmp_path: Path
) -> None:
    """Inside a batch job, srun signs with its user's key, which is also its bus
    credential: the step runs and its output comes back (docs/steps.md)."""
    keys = secured.cluster.state_dir / "keys"
    out = tmp_path / "step.txt"
    script = tmp_path / "steps.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"export MUSTER_KEY_DIR={keys}  # the launcher passes no MUSTER_ variable of ours\n"
        f"{sys.executable} -m muster.lean srun -n 1"
        f" bash -c 'echo step-$SLURM_PROCID-$SLURM_STEP_ID' > {out}\n"
    )
    job = cli(secured, "root", "submit", str(script), CWD=str(tmp_path)).split()[-1]
    shown = await eventually(
        lambda: asyncio.to_thread(cli, secured, "root", "queue", "-a", "-j", job),
        lambda text: any(s in text for s in ("COMPLETED", "FAILED", "CANCELLED")),
        what=f"job {job} ended",
        timeout=90,
    )
    assert "COMPLETED" in shown, (shown, out.read_text() if out.exists() else "no output")
    assert out.read_text().strip() == "step-0-0"
