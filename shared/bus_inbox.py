"""Pure: the inbox prefix a user's bus connection draws its reply subjects from, and
alone may subscribe to (shared/bus_auth.py grants it, the CLI and the gateway use it).
Import-free, so the CLI's lean path (muster/lean.py) pays nothing for it."""

from __future__ import annotations

USERS_INBOX = "_INBOX"
# A user name that is one NATS subject token as it stands ("alice", "j_doe-2") is used as
# it is; any other ("j.doe": two tokens, and "j.>" would cover it) is spelled in hex
# after a "~", which no such name contains, so no user's prefix is a prefix of another's.
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def user_inbox(user: str) -> str:
    """`_INBOX.<user>`: the inboxes of user `user` (subscribe `_INBOX.<user>.>`)."""
    if user and all(c in _TOKEN_CHARS for c in user):
        return f"{USERS_INBOX}.{user}"
    return f"{USERS_INBOX}.~{user.encode().hex()}"
