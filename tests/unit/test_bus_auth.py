"""The bus permission table (shared/bus_auth.py): who may publish what, by identity."""

from __future__ import annotations

import pytest

from shared import bus_auth
from shared.identity import encode_public_key

USERS = bus_auth.user_permissions("alice")
PLACER = bus_auth.service_permissions("placer")
AGENT = bus_auth.agent_permissions("node01")

CASES = {
    "a user requests the API": (USERS, "muster.api.submit", True),
    "a user publishes no event": (USERS, "muster.job.allocated", False),
    "a user has no JetStream API": (USERS, "$JS.API.STREAM.DELETE.MUSTER", False),
    "a user calls no agent": (USERS, "muster.agent.node01.start", False),
    "the placer publishes its allocations": (PLACER, "muster.job.allocated", True),
    "the placer publishes no one else's event": (PLACER, "muster.job.submitted", False),
    "the placer starts no workers": (PLACER, "muster.agent.node01.start", False),
    "an agent heartbeats for its node": (AGENT, "muster.heartbeat.node01", True),
    "an agent heartbeats for no other node": (AGENT, "muster.heartbeat.node02", False),
    "an agent reports its node's worker exits": (AGENT, "muster.worker.exited.node01", True),
    "an agent reports no other node's worker exits": (
        AGENT,
        "muster.worker.exited.node02",
        False,
    ),
    "an agent reports no node-less worker exit": (AGENT, "muster.worker.exited", False),
    "an agent reports its node's XIDs": (AGENT, "muster.gpu.xid_observed.node01", True),
    "an agent reports no other node's XID": (AGENT, "muster.gpu.xid_observed.node02", False),
    "an agent publishes no fault verdict": (AGENT, "muster.node.fault", False),
    "an agent has no JetStream API": (AGENT, "$JS.API.STREAM.CREATE.MUSTER", False),
}


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


@pytest.mark.parametrize(("perms", "subject", "want"), CASES.values(), ids=CASES.keys())
def test_publish(perms: bus_auth.Permissions, subject: str, want: bool) -> None:
    assert any(matches(p, subject) for p in perms.publish) is want


def test_each_event_has_one_publishing_identity() -> None:
    owners: dict[str, str] = {}
    for service, tags in bus_auth.SERVICE_EVENTS.items():
        for tag in tags:
            assert tag not in owners, f"{tag}: {owners.get(tag)} and {service}"
            owners[tag] = service
    for tag in bus_auth.AGENT_EVENTS:
        assert tag not in owners, f"{tag}: {owners.get(tag)} and the agents"


def test_a_service_and_an_agent_read_only_their_own_inboxes() -> None:
    assert PLACER.subscribe == ("_I.placer.>",)
    assert AGENT.subscribe == ("_I.node-node01.>", "muster.agent.node01.>", "muster.pty.*.*.in")
    assert USERS.subscribe == ("_INBOX.alice.>", "muster.pty.alice.*.out")


INBOXES = {
    "a plain name is its own token": ("alice", "_INBOX.alice"),
    "dashes and underscores are kept": ("j_doe-2", "_INBOX.j_doe-2"),
    # "j.doe" as it stands would be two tokens, and user "j"'s "_INBOX.j.>" would cover it
    "a dotted name is spelled in hex": ("j.doe", "_INBOX.~6a2e646f65"),
    "a wildcard is spelled in hex": ("*", "_INBOX.~2a"),
}


@pytest.mark.parametrize(("user", "want"), INBOXES.values(), ids=INBOXES.keys())
def test_a_users_inbox_is_one_token_no_other_users_covers(user: str, want: str) -> None:
    assert bus_auth.user_inbox(user) == want


def test_each_registered_key_is_a_bus_user_of_its_own_inbox_and_a_bad_key_none() -> None:
    alice, bob = encode_public_key(b"a" * 32), encode_public_key(b"b" * 32)
    got = bus_auth.user_bus_users({bob: "bob", "Unot-a-key": "mallory", alice: "alice"})
    assert [(u.name, u.nkey, u.permissions.subscribe) for u in got] == [
        ("user alice", alice, ("_INBOX.alice.>", "muster.pty.alice.*.out")),
        ("user bob", bob, ("_INBOX.bob.>", "muster.pty.bob.*.out")),
    ]
    assert [u.permissions.publish for u in got] == [
        ("muster.api.*", "muster.pty.alice.*.in"),
        ("muster.api.*", "muster.pty.bob.*.in"),
    ]


def test_the_users_entries_are_rendered_again_and_the_rest_kept() -> None:
    admin = bus_auth.BusUser(
        name="admin", nkey="UADMIN", permissions=bus_auth.Permissions(everything=True)
    )
    alice, bob = encode_public_key(b"a" * 32), encode_public_key(b"b" * 32)
    text = bus_auth.render_authorization([admin], bus_auth.user_bus_users({alice: "alice"}))
    again = bus_auth.with_users(text, bus_auth.user_bus_users({bob: "bob"}))
    assert alice in text and alice not in again and bob in again
    assert '{ nkey: "UADMIN" }' in again
    assert again == bus_auth.render_authorization([admin], bus_auth.user_bus_users({bob: "bob"}))
    # a service's key registered as a user's too is left out: NATS refuses a doubled key
    service = bus_auth.BusUser(name="placer", nkey=bob, permissions=PLACER)
    doubled = bus_auth.user_bus_users({alice: "alice", bob: "bob"})
    text = bus_auth.render_authorization([service], doubled)
    assert text.count(bob) == 1 and alice in text
    assert bus_auth.with_users(text, doubled) == text
    odd = bus_auth.user_bus_users({alice: "a\nb"})  # a quoted TOML key may hold a newline
    assert "\n    # user a?b\n" in bus_auth.render_authorization([], odd)
    with pytest.raises(ValueError, match="no users section"):
        bus_auth.with_users("authorization { users = [] }\n", ())


def test_the_authorization_block_names_every_key() -> None:
    users = [
        bus_auth.BusUser(name="user alice", nkey="UUSERS", permissions=USERS),
        bus_auth.BusUser(
            name="admin", nkey="UADMIN", permissions=bus_auth.Permissions(everything=True)
        ),
    ]
    text = bus_auth.render_authorization(users)
    assert '{ nkey: "UADMIN" }' in text
    assert '{ nkey: "UUSERS", permissions: { publish: { allow: ["muster.api.*", ' in text
