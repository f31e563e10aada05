"""Which bus identity the CLI connects with (muster/client_env.py: bus_credentials): the
user's own key file and inbox, an explicit credential or inbox, the operator's key for
agent calls; and what the CLI says when the bus refuses it (muster/exchange.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.client_env import bus_credentials, register_cluster
from muster.exchange import bus_refusal
from shared import bus_auth, bus_inbox

URL = "nats://127.0.0.1:1"
VARIABLES = (
    "MUSTER_NATS_CREDS",
    "MUSTER_NATS_INBOX_PREFIX",
    "MUSTER_NATS_TLS_CA",
    "MUSTER_KEY_FILE",
    "MUSTER_KEY_DIR",
    "MUSTER_USER",
)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOGNAME", "carol")
    keys = tmp_path / "keys"
    keys.mkdir()
    for user in ("alice", "carol"):
        (keys / f"{user}.nk").write_text("SU...\n")
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "nats-admin.nk").write_text("SU...\n")
    monkeypatch.setenv("MUSTER_KEY_DIR", str(keys))
    register_cluster(URL, tmp_path)
    return tmp_path


CASES = {
    "a request's user connects with their key, on their inbox": (
        {}, "alice", False, ("keys/alice.nk", "_INBOX.alice"),
    ),
    "MUSTER_USER names the user when the request does not": (
        {"MUSTER_USER": "alice"}, "", False, ("keys/alice.nk", "_INBOX.alice"),
    ),
    "without either, the login name": ({}, "", False, ("keys/carol.nk", "_INBOX.carol")),
    "a user without a key file connects without one (an open bus)": (
        {}, "zed", False, ("", "_INBOX.zed"),
    ),
    "MUSTER_NATS_CREDS and MUSTER_NATS_INBOX_PREFIX name another identity": (
        {"MUSTER_NATS_CREDS": "/etc/muster/nats-gw.nk", "MUSTER_NATS_INBOX_PREFIX": "_I.gw"},
        "alice", False, ("/etc/muster/nats-gw.nk", "_I.gw"),
    ),
    "an agent call uses the operator's key when it is readable": (
        {}, "alice", True, ("secrets/nats-admin.nk", "_INBOX.alice"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("env", "user", "operator", "want"), CASES.values(), ids=CASES.keys())
def test_bus_credentials(
    state: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    user: str,
    operator: bool,
    want: tuple[str, str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    creds, ca, inbox = bus_credentials(URL, operator=operator, user=user)
    want_creds = want[0] if not want[0] or want[0].startswith("/") else str(state / want[0])
    assert (creds, ca, inbox) == (want_creds, "", want[1])


def test_the_cli_and_the_authorization_agree_on_a_users_inbox_and_terminals() -> None:
    for user in ("alice", "j.doe", "x*"):
        subscribe = bus_auth.user_permissions(user).subscribe
        assert subscribe == (bus_auth.user_inbox(user) + ".>", bus_inbox.user_pty(user) + ".*.out")


REFUSALS = {
    "an unregistered or removed key": (
        "Authorization Violation", "/k/erin.nk", "_INBOX.erin", "not registered on this cluster",
    ),
    "a key registered under another name": (
        'Permissions Violation for Subscription to "_INBOX.erin.3f"', "/k/erin.nk",
        "_INBOX.erin", "set MUSTER_USER",
    ),
    "anything else as the server said it": (
        "Maximum Connections Exceeded", "", "_INBOX.erin", "refused this client: Maximum",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("error", "creds", "inbox", "want"), REFUSALS.values(), ids=REFUSALS.keys()
)
def test_a_bus_refusal_says_what_to_do(error: str, creds: str, inbox: str, want: str) -> None:
    assert want in bus_refusal(error, creds, inbox)
