"""Least privilege on the bus and in the database, tried as an attacker would against a
running secured cluster (tests/support/secure.py: the servers as `muster up` starts
them): every attempt is refused by the server and leaves nothing behind, and a job
still runs end to end."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError

from services.admission.purge import PURGE_JOBS
from shared import embedded
from shared.api import WorkerSpec
from shared.bus import DLQ_PREFIX, DLQ_STREAM, STREAM
from shared.events import (
    GpuXidObserved,
    JobAllocated,
    NodeRegistered,
    UsageTicked,
    encode,
    node_subject,
    subject_of,
)
from shared.security import make_tls, nats_options, provision_bus
from tests.support.cluster import eventually, job_state, nodes, submit
from tests.support.secure import Secured, secured_cluster

pytestmark = pytest.mark.slow

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    with secured_cluster(nodes(2, gpus=2)) as s:
        yield s


class Watched:
    """A connection that keeps the errors the server sends it (-ERR lines)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Client | None = None

    async def connect(self, url: str, creds: str, **extra: object) -> Client:
        async def on_error(err: Exception) -> None:
            self.errors.append(str(err))

        self.nc = await nats.connect(
            url, allow_reconnect=False, error_cb=on_error, **nats_options(creds), **extra
        )
        return self.nc

    async def violated(self, subject: str) -> list[str]:
        return await eventually(
            lambda: asyncio.sleep(0, self.errors),
            lambda errs: any(
                "permissions violation" in e.lower() and subject.lower() in e.lower() for e in errs
            ),
            what=f"a permissions violation for {subject}",
        )


@pytest.fixture
async def user(secured: Secured) -> AsyncIterator[Watched]:
    watched = Watched()
    nc = await watched.connect(
        secured.nats_url, secured.user_key("mallory"), inbox_prefix="_INBOX.mallory"
    )
    try:
        yield watched
    finally:
        await nc.close()


async def last_on(secured: Secured, subject: str) -> bytes | None:
    """The last message the stream holds on `subject` (read with the admin credential)."""
    nc = await nats.connect(secured.nats_url, **nats_options(secured.creds("admin")))
    try:
        msg = await nc.jetstream().get_last_msg(STREAM, subject)
        return msg.data
    except NotFoundError:
        return None
    finally:
        await nc.close()


async def test_a_connection_without_a_credential_is_refused(secured: Secured) -> None:
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(secured.nats_url, allow_reconnect=False, max_reconnect_attempts=0)


@pytest.mark.parametrize(
    "event",
    [
        JobAllocated(
            event_id=uuid.uuid4(),
            occurred_at=NOW,
            job_id=424242,
            attempt=1,
            alloc_id=1,
            grants=(),
            epoch=1,
        ),
        NodeRegistered(
            event_id=uuid.uuid4(), occurred_at=NOW, node="evil01", address="203.0.113.9", gpus=()
        ),
        UsageTicked(
            event_id=uuid.uuid4(),
            occurred_at=NOW,
            job_id=424242,
            attempt=1,
            user="mallory",
            account="research",
            gpu_model="SIM-H100",
            gpu_seconds_total=1e9,
        ),
    ],
    ids=lambda e: subject_of(e),
)
async def test_a_user_cannot_publish_an_internal_event(
    secured: Secured, user: Watched, event: JobAllocated | NodeRegistered | UsageTicked
) -> None:
    assert user.nc is not None
    subject = subject_of(event)
    with pytest.raises(NatsError):
        await user.nc.jetstream().publish(subject, encode(event), timeout=2)
    await user.violated(subject)
    last = await last_on(secured, subject)
    assert last is None or str(event.event_id) not in last.decode()
    db = await asyncpg.connect(secured.admin_url)
    try:
        assert await db.fetchval("SELECT count(*) FROM nodes WHERE name = 'evil01'") == 0
        assert await db.fetchval("SELECT count(*) FROM usage_charges WHERE job_id = 424242") == 0
    finally:
        await db.close()


async def test_a_user_cannot_call_an_agent(secured: Secured, user: Watched, tmp_path: Path) -> None:
    assert user.nc is not None
    mark = tmp_path / "ran"
    spec = WorkerSpec(
        job_id=424243, attempt=1, generation=1, argv=("touch", str(mark)), env={},
        workdir="/tmp", stdout="/dev/null", stderr="/dev/null",
    )  # fmt: skip
    with pytest.raises(NatsError):
        await user.nc.request("muster.agent.node01.start", msgspec.json.encode(spec), timeout=2)
    await user.violated("muster.agent.node01.start")
    assert not mark.exists()


async def test_an_agent_speaks_only_for_its_own_node(secured: Secured) -> None:
    agent = Watched()
    nc = await agent.connect(
        secured.nats_url, secured.creds("node-node01"), inbox_prefix="_I.node-node01"
    )
    try:
        await nc.publish("muster.heartbeat.node02", b"forged")
        await nc.publish("muster.agent.node02.start", b"{}")
        await nc.flush()
        await agent.violated("muster.heartbeat.node02")
        await agent.violated("muster.agent.node02.start")
    finally:
        await nc.close()


def info_xid(node: str) -> GpuXidObserved:
    """An XID the catalog counts and does nothing about (92: single-bit ECC rate)."""
    return GpuXidObserved(event_id=uuid.uuid4(), occurred_at=NOW, node=node, gpu=0, xid=92)


async def test_an_agent_publishes_node_events_on_its_own_node_subjects_only(
    secured: Secured,
) -> None:
    agent = Watched()
    nc = await agent.connect(
        secured.nats_url, secured.creds("node-node01"), inbox_prefix="_I.node-node01"
    )
    try:
        forged = info_xid("node02")
        with pytest.raises(NatsError):
            await nc.jetstream().publish(subject_of(forged), encode(forged), timeout=2)
        await agent.violated("muster.gpu.xid_observed.node02")
        last = await last_on(secured, "muster.gpu.xid_observed.node02")
        assert last is None or str(forged.event_id) not in last.decode()

        own = info_xid("node01")
        assert subject_of(own) == "muster.gpu.xid_observed.node01"
        ack = await nc.jetstream().publish(subject_of(own), encode(own), timeout=5)
        assert ack.stream == STREAM
    finally:
        await nc.close()


async def test_a_consumer_refuses_a_node_event_about_another_node(secured: Secured) -> None:
    # Node01's agent may publish on its own subject; a payload naming node02 there is
    # dead-lettered by the health monitor, never handled.
    agent = Watched()
    nc = await agent.connect(
        secured.nats_url, secured.creds("node-node01"), inbox_prefix="_I.node-node01"
    )
    forged = info_xid("node02")
    try:
        subject = node_subject("gpu.xid_observed", "node01")
        await nc.jetstream().publish(subject, encode(forged), timeout=5)
    finally:
        await nc.close()
    admin = await nats.connect(secured.nats_url, **nats_options(secured.creds("admin")))

    async def dead_letter() -> str:
        try:
            msg = await admin.jetstream().get_last_msg(DLQ_STREAM, DLQ_PREFIX + "health")
        except NotFoundError:
            return ""
        return (msg.data or b"").decode() + str(msg.headers)

    try:
        text = await eventually(
            dead_letter,
            lambda t: str(forged.event_id) in t,
            timeout=60,
            what="the forged XID dead-lettered by the health monitor",
        )
        assert "node mismatch" in text and "node02" in text and "node01" in text
    finally:
        await admin.close()


async def test_a_user_cannot_delete_a_stream(secured: Secured, user: Watched) -> None:
    assert user.nc is not None
    with pytest.raises(NatsError):
        await user.nc.jetstream().delete_stream(STREAM)
    await user.violated("$JS.API.STREAM.DELETE.MUSTER")
    admin = await nats.connect(secured.nats_url, **nats_options(secured.creds("admin")))
    try:
        info = await admin.jetstream().stream_info(STREAM)
        assert info.config.name == STREAM
    finally:
        await admin.close()


async def test_a_database_login_without_the_password_is_refused(secured: Secured) -> None:
    for role in ("postgres", "muster_admission"):
        url = f"{secured.pg_url.replace('postgres@', f'{role}@')}/muster"
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(url, passfile="/nonexistent")
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(url, password="guess", passfile="/nonexistent")


async def test_a_service_cannot_write_a_table_another_service_owns(secured: Secured) -> None:
    placer = await asyncpg.connect(secured.role_url("muster_placer"))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await placer.execute("UPDATE nodes SET state = 'UP'")  # health's
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await placer.execute("DELETE FROM jobs")  # admission's
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await placer.execute("DROP TABLE allocations")  # its own, but not its schema
        assert await placer.fetchval("SELECT count(*) FROM nodes") == 2  # it may read
    finally:
        await placer.close()


async def test_admission_purges_only_through_the_function_and_no_other_role_may(
    secured: Secured,
) -> None:
    """Admission's role may call the purge of finished jobs (migration 0027), which
    removes other services' rows with its owner's rights; it gains no write on those
    tables, and no other role may call it."""
    admission = await asyncpg.connect(secured.role_url("muster_admission"))
    placer = await asyncpg.connect(secured.role_url("muster_placer"))
    try:
        assert await admission.fetchval(PURGE_JOBS, 0.0, 10) == 0  # nothing ended long ago
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await admission.execute("DELETE FROM job_runs")  # the launcher's
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await placer.fetchval(PURGE_JOBS, 0.0, 10)
    finally:
        await admission.close()
        await placer.close()


async def test_a_job_runs_end_to_end_on_the_secured_cluster(secured: Secured) -> None:
    reply = await submit(secured.nats_url, "#!/bin/sh\necho secured\n")
    db = await asyncpg.connect(secured.admin_url)
    try:
        await eventually(
            lambda: job_state(db, reply.job_ids[0]),
            lambda s: s == "COMPLETED",
            timeout=60,
            what="the job COMPLETED",
        )
        # Every service's relay publishes its own events (none is left to no one); the
        # last ones may still be on their way as the job's state commits.
        await eventually(
            lambda: db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL"),
            lambda left: left == 0,
            what="every outbox row published",
        )
    finally:
        await db.close()


async def test_tls_clients_verify_the_server(tmp_path: Path) -> None:
    bus = provision_bus(tmp_path, ["node01"])
    tls = make_tls(tmp_path)
    server = embedded.start_nats(tmp_path, config=bus.auth_conf.read_text() + tls.nats_block())
    try:
        nc = await nats.connect(server.url, **nats_options(str(bus.creds("admin")), str(tls.ca)))
        assert nc.connected_url is not None
        await nc.close()
        other = make_tls(tmp_path / "other")  # a CA that did not sign the server
        with pytest.raises(Exception, match=r"(?i)certificate"):
            await nats.connect(
                server.url,
                allow_reconnect=False,
                **nats_options(str(bus.creds("admin")), str(other.ca)),
            )
    finally:
        server.stop()
