"""The node events' subject scheme (`muster.<tag>.<node>`) and the consumers' check that
a node event arrives on its own node's subject (shared/events.py, docs/security.md)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared import bus_auth
from shared.events import (
    NODE_SUBJECT_TAGS,
    Event,
    GpuXidObserved,
    NodeDown,
    NodeHookFailed,
    WorkerExited,
    node_filter,
    node_mismatch,
    subject_of,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ID = uuid.UUID(int=1)


def xid(node: str) -> GpuXidObserved:
    return GpuXidObserved(event_id=ID, occurred_at=NOW, node=node, gpu=0, xid=79)


def exited(node: str) -> WorkerExited:
    return WorkerExited(event_id=ID, occurred_at=NOW, job_id=1, attempt=1, node=node, exit_code=0)


HOOK = NodeHookFailed(event_id=ID, occurred_at=NOW, node="n1", hook="prolog", reason="x")
DOWN = NodeDown(event_id=ID, occurred_at=NOW, node="node01", reason="heartbeat")

SUBJECTS: dict[str, tuple[Event, str]] = {
    "an XID names its node": (xid("node01"), "muster.gpu.xid_observed.node01"),
    "a worker exit names its node": (exited("node02"), "muster.worker.exited.node02"),
    "a hook failure names its node": (HOOK, "muster.node.hook_failed.n1"),
    "a dotted node name stays whole": (xid("rack1.node01"), "muster.gpu.xid_observed.rack1.node01"),
    "a service's verdict keeps its plain subject": (DOWN, "muster.node.down"),
}


@pytest.mark.parametrize(("event", "want"), SUBJECTS.values(), ids=SUBJECTS.keys())
def test_the_subject_of_an_event(event: Event, want: str) -> None:
    assert subject_of(event) == want


CHECKS: dict[str, tuple[str, Event, str | None]] = {
    "its own node's subject is handled": ("muster.gpu.xid_observed.node01", xid("node01"), None),
    "another node's payload on node01's subject is refused": (
        "muster.gpu.xid_observed.node01",
        xid("node02"),
        "node mismatch: gpu.xid_observed about node 'node02' on the subject of node 'node01'",
    ),
    "a node-less subject is refused": (
        "muster.worker.exited",
        exited("node01"),
        "node mismatch: worker.exited about node 'node01' on the subject of node ''",
    ),
    "a node name that only starts the same is refused": (
        "muster.worker.exited.node011",
        exited("node01"),
        "node mismatch: worker.exited about node 'node01' on the subject of node 'node011'",
    ),
    "a dotted node name matches whole": (
        "muster.gpu.xid_observed.rack1.node01",
        xid("rack1.node01"),
        None,
    ),
    "a service's event is not checked": ("muster.node.down", DOWN, None),
}


@pytest.mark.parametrize(("subject", "event", "want"), CHECKS.values(), ids=CHECKS.keys())
def test_a_node_event_must_come_on_its_own_node_subject(
    subject: str, event: Event, want: str | None
) -> None:
    assert node_mismatch(subject, event) == want


def test_an_agent_may_publish_exactly_its_own_node_subjects() -> None:
    perms = bus_auth.agent_permissions("node01")
    want = {f"muster.{tag}.node01" for tag in NODE_SUBJECT_TAGS} | {"muster.heartbeat.node01"}
    # and the terminal output of the `srun --pty` steps it runs, on any user's subject
    assert set(perms.publish) == want | {"muster.pty.*.*.out"}


def test_a_node_filter_takes_every_node() -> None:
    assert node_filter("node.registered") == "muster.node.registered.>"


def test_the_example_authorization_file_is_what_shared_bus_auth_renders() -> None:
    text = (Path(__file__).parents[2] / "deploy" / "nats" / "authorization.conf").read_text()
    users = [
        bus_auth.BusUser(
            name="node",
            nkey="U_NODE01_PUBLIC_KEY",
            permissions=bus_auth.agent_permissions("NODE01"),
        )
    ]
    users += [
        bus_auth.BusUser(
            name=s, nkey=f"U_{s.upper()}_PUBLIC_KEY", permissions=bus_auth.service_permissions(s)
        )
        for s in bus_auth.SERVICES
    ]
    users.append(
        bus_auth.BusUser(
            name="alice", nkey="U_ALICE_PUBLIC_KEY", permissions=bus_auth.user_permissions("alice")
        )
    )
    for user in users:
        line = bus_auth.render_authorization([user]).splitlines()[4]
        assert line in text, f"deploy/nats/authorization.conf is stale for {user.name}"
