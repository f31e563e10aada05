"""End to end on a running local cluster (every service a process): forged, unsigned,
replayed and stale requests are refused with what to do, and leave nothing behind (no
job row, no outbox row); other users' jobs, scripts, environments and accounting are
private; the abuse limits refuse with the limit and its value; keys are added and
removed while the cluster runs."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import asyncpg
import msgspec
import nats
import pytest

from muster.client import ApiRefused, call
from muster.cluster import Cluster
from services.fairshare.api import AcctReply, AcctRequest, ShareReply, ShareRequest
from shared.api import (
    API_PREFIX,
    Envelope,
    JobSelector,
    NodeAction,
    Ok,
    QueueReply,
    QueueRequest,
    ReloadReply,
    Request,
    ShowJobReply,
    ShowJobRequest,
    SubmitReply,
    SubmitRequest,
)
from shared.identity import SignedRequest, Signer, encode_seed
from shared.identity_files import load_signer
from shared.privacy import REDACTED
from tests.support.cluster import REPO, eventually, nodes, run_cli, running_cluster

pytestmark = pytest.mark.slow

SCRIPT = "#!/bin/bash\n# the secret sauce\nsleep 60\n"
LOCAL = (REPO / "deploy" / "local" / "cluster.toml").read_text()


def configured(private: str = '["jobs", "scripts", "usage"]', limits: str = "") -> str:
    text = LOCAL.replace("[cluster]\n", f"[cluster]\nprivate_data = {private}\n", 1)
    return text + (f"\n[limits]\n{limits}\n" if limits else "")


class Secure:
    def __init__(self, cluster: Cluster, config: Path) -> None:
        self.url = cluster.nats_url
        self.config = config
        self.keys = cluster.state_dir / "keys"

    def key(self, user: str) -> Signer:
        return load_signer(str(self.keys / f"{user}.nk"))

    async def raw(self, verb: str, payload: bytes) -> Envelope:
        nc = await nats.connect(self.url)
        try:
            msg = await nc.request(API_PREFIX + verb, payload, timeout=15)
        finally:
            await nc.close()
        return msgspec.json.decode(msg.data, type=Envelope)

    async def submit(self, user: str, *argv: str, script: str = SCRIPT) -> int:
        req = SubmitRequest(user=user, argv=argv, script=script, script_path="job.sh")
        return (await call(self.url, "submit", req, SubmitReply)).job_ids[0]


@pytest.fixture
async def secure(
    tmp_path: Path, nats_url: str, database_url: str, db: asyncpg.Connection
) -> AsyncIterator[Secure]:
    config = tmp_path / "cluster.toml"
    config.write_text(
        configured(limits="submit_burst = 4\nsubmit_rate = 0.05\nmax_script_bytes = 2000")
    )
    async with running_cluster(
        tmp_path / "state",
        nats_url,
        database_url,
        db,
        nodes(2),
        env={"MUSTER_CLUSTER_CONFIG": str(config)},
    ) as c:
        # running_cluster waits for the nodes; a signed call waits for admission too
        await call(c.nats_url, "queue", QueueRequest(user="root"), QueueReply)
        yield Secure(c, config)


async def stored(db: asyncpg.Connection) -> tuple[int, int]:
    """(job rows, job.submitted outbox rows): what a refused request must not add."""
    jobs = await db.fetchval("SELECT count(*) FROM jobs")
    events = await db.fetchval("SELECT count(*) FROM outbox WHERE subject = 'muster.job.submitted'")
    return int(jobs), int(events)


def submit_body(user: str = "") -> bytes:
    return msgspec.json.encode(SubmitRequest(user=user, script=SCRIPT, script_path="job.sh"))


async def test_forged_unsigned_replayed_and_stale_requests_are_refused_and_store_nothing(
    secure: Secure, db: asyncpg.Connection
) -> None:
    alice, bob = secure.key("alice"), secure.key("bob")
    subject = API_PREFIX + "submit"
    now = time.time()
    first = alice.sign(subject, submit_body(), now=now, nonce=os.urandom(16))
    assert (await secure.raw("submit", first)).error is None  # the one accepted job
    before = await stored(db)
    assert before == (1, 1)

    # alice's signature presented as bob's: the key field swapped, the rest as sent
    as_bob = msgspec.structs.replace(
        msgspec.json.decode(first, type=SignedRequest), key=bob.public_key
    )
    forged_key = msgspec.json.encode(as_bob)
    stranger = Signer(encode_seed(os.urandom(32)))
    cases = {
        "unsigned": (submit_body("alice"), "unsigned", "muster keygen"),
        "bad_signature": (forged_key, "bad_signature", "does not match"),
        "user_mismatch": (
            alice.sign(subject, submit_body("root"), now=now, nonce=os.urandom(16)),
            "user_mismatch", "signed by 'alice'",
        ),
        "replayed": (first, "replayed", "already received"),
        "stale": (
            alice.sign(subject, submit_body(), now=now - 3600, nonce=os.urandom(16)),
            "stale_request", "behind the server's clock",
        ),
        "unknown_key": (
            stranger.sign(subject, submit_body(), now=now, nonce=os.urandom(16)),
            "unknown_key", f"muster user add NAME --key {stranger.public_key}",
        ),
    }  # fmt: skip
    for name, (payload, code, says) in cases.items():
        env = await secure.raw("submit", payload)
        assert env.error is not None, name
        assert (env.error.code, says in env.error.error) == (code, True), (name, env.error)
    assert await stored(db) == before  # nothing persisted by any of them


async def test_a_user_acts_only_as_themself_and_operators_come_from_the_configuration(
    secure: Secure, db: asyncpg.Connection
) -> None:
    bobs = await secure.submit("bob")
    # alice's own key, asking to cancel bob's job: she is alice, and it is not hers
    with pytest.raises(ApiRefused) as refused:
        await call(
            secure.url, "cancel", JobSelector(job_ids=(bobs,)), Ok, signer=secure.key("alice")
        )
    assert refused.value.code == "forbidden"
    assert "'alice' may not cancel a job of 'bob'" in str(refused.value)
    # mallory has a registered key but is no operator: drain and reload are refused
    for verb, req in (
        ("drain", NodeAction(node="node01", reason="mine now")),
        ("reload", Request()),
    ):
        with pytest.raises(ApiRefused) as refused:
            await call(
                secure.url,
                verb,
                req,
                Ok if verb == "drain" else ReloadReply,
                signer=secure.key("mallory"),
            )
        assert "not an operator" in str(refused.value), verb
    assert (
        await db.fetchval(
            "SELECT count(*) FROM outbox WHERE subject = 'muster.node.drain_requested'"
        )
        == 0
    )
    assert await db.fetchval("SELECT cancel_requested_at FROM jobs WHERE job_id = $1", bobs) is None
    # root is an operator because the configuration says so: the cancel goes through
    await call(secure.url, "cancel", JobSelector(user="root", job_ids=(bobs,)), Ok)


async def test_other_users_jobs_scripts_environment_and_usage_are_private(secure: Secure) -> None:
    job = await secure.submit("alice", "--export=ALL,TOKEN=s3cr3t", "--comment", "x")

    def show(user: str) -> Awaitable[ShowJobReply]:
        return call(secure.url, "show", ShowJobRequest(user=user, job_id=job), ShowJobReply)

    for allowed in ("alice", "carol", "root"):  # owner, coordinator of research, operator
        spec = (await show(allowed)).spec
        assert spec["script"] == SCRIPT and "s3cr3t" in msgspec.json.encode(spec).decode()
    for other in ("bob", "dave"):  # a user of the same account; another account's coordinator
        with pytest.raises(ApiRefused) as refused:
            await show(other)
        assert refused.value.code == "private" and "belongs to 'alice'" in str(refused.value)

    def queued(user: str) -> Awaitable[QueueReply]:
        return call(secure.url, "queue", QueueRequest(user=user, all_states=True), QueueReply)

    assert [j.job_id for j in (await queued("alice")).jobs] == [job]
    assert (await queued("bob")).jobs == ()
    assert [j.job_id for j in (await queued("carol")).jobs] == [job]

    def acct(user: str) -> Awaitable[AcctReply]:
        return call(secure.url, "acct", AcctRequest(user=user, attempts=False), AcctReply)

    await eventually(
        lambda: acct("root"), lambda r: [x.job_id for x in r.rows] == [job], 20, "acct"
    )
    assert [r.job_id for r in (await acct("alice")).rows] == [job]
    assert [r.job_id for r in (await acct("carol")).rows] == [job]
    assert (await acct("bob")).rows == ()
    shares = await call(secure.url, "share", ShareRequest(user="bob"), ShareReply)
    assert {r.user for r in shares.rows if r.user} == {"bob"}  # account rows and bob's own

    # jobs made public, scripts kept private: bob sees the job, not its script or env
    secure.config.write_text(configured(private='["scripts"]'))
    await call(secure.url, "reload", Request(user="root"), ReloadReply)
    spec = (await show("bob")).spec
    assert (spec["script"], spec["env"], spec["export"]) == (REDACTED, {}, "NONE")
    assert spec["user"] == "alice" and spec["partition"] == "normal"  # the rest is there


async def test_the_abuse_limits_refuse_with_the_limit_and_its_value(
    secure: Secure, db: asyncpg.Connection
) -> None:
    with pytest.raises(ApiRefused) as refused:
        await secure.submit("alice", script="#!/bin/bash\n" + "#" * 3000 + "\n")
    assert refused.value.code == "too_large"
    assert "3013 bytes; the limit (limits.max_script_bytes) is 2000" in str(refused.value)
    ids = [await secure.submit("dave") for _ in range(4)]  # the burst
    with pytest.raises(ApiRefused) as refused:
        await secure.submit("dave")
    assert refused.value.code == "rate_limited"
    assert "limits.submit_burst = 4" in str(refused.value)
    assert "limits.submit_rate = 0.05" in str(refused.value)
    assert (await stored(db))[0] == len(ids)  # neither refusal stored anything
    # the limit is per user: alice still submits
    assert await secure.submit("alice")


async def test_a_key_added_while_the_cluster_runs_signs_and_a_removed_one_no_longer_does(
    secure: Secure, tmp_path: Path
) -> None:
    new = tmp_path / "rotated.nk"
    env = {"HOME": str(tmp_path), "MUSTER_NATS_URL": secure.url}
    made = run_cli("keygen", "--file", str(new), env=env)
    assert made.returncode == 0, made.stderr
    signer = load_signer(str(new))

    def queue() -> Awaitable[QueueReply]:
        return call(secure.url, "queue", QueueRequest(), QueueReply, signer=signer)

    with pytest.raises(ApiRefused) as refused:
        await queue()
    assert refused.value.code == "unknown_key"

    added = run_cli(
        "user", "add", "alice", "--key", signer.public_key, "--config", str(secure.config), env=env
    )
    assert added.returncode == 0, added.stderr

    async def works() -> bool:
        try:
            await queue()
        except ApiRefused:
            return False
        return True

    await eventually(works, bool, 20, "the new key honoured")
    job = (
        await call(secure.url, "submit", SubmitRequest(script=SCRIPT), SubmitReply, signer=signer)
    ).job_ids[0]
    show = await call(secure.url, "show", ShowJobRequest(user="alice", job_id=job), ShowJobReply)
    assert show.job.user == "alice"  # the new key acts as alice, the name taken from the key

    removed = run_cli(
        "user",
        "remove-key",
        "alice",
        "--key",
        signer.public_key,
        "--config",
        str(secure.config),
        env=env,
    )
    assert removed.returncode == 0, removed.stderr
    await eventually(works, lambda ok: not ok, 20, "the removed key refused")


async def test_the_cli_signs_as_muster_user_and_says_what_to_do_without_a_key(
    secure: Secure, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(SCRIPT)
    env = {"MUSTER_NATS_URL": secure.url, "MUSTER_USER": "bob", "CWD": str(tmp_path)}
    out = run_cli("submit", str(script), env=env)
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.split()[-1])
    show = await call(secure.url, "show", ShowJobRequest(user="root", job_id=job), ShowJobReply)
    assert show.job.user == "bob"

    nokey = {**env, "HOME": str(tmp_path), "MUSTER_KEY_DIR": str(tmp_path), "MUSTER_USER": "zed"}
    out = run_cli("queue", env=nokey)
    assert out.returncode == 1
    assert "no usable key" in out.stderr and "muster keygen" in out.stderr
