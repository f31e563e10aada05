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


# `srun --pty`'s terminal: output on `<subject>.out`, keys on `<subject>.in`, where the
# subject is `muster.pty.<the user's token>.<32 hex digits>` (srun draws it; the launcher
# refuses any other for that user), so only that user and the agents may use it.
PTY_PREFIX = "muster.pty"
_HEX = frozenset("0123456789abcdef")


def user_token(user: str) -> str:
    """The one subject token that names `user` in their inboxes and terminals."""
    return user_inbox(user)[len(USERS_INBOX) + 1 :]


def user_pty(user: str) -> str:
    """`muster.pty.<user>`: the prefix of every terminal subject of `user`."""
    return f"{PTY_PREFIX}.{user_token(user)}"


def is_users_pty(user: str, subject: str) -> bool:
    """Whether `subject` is a terminal subject `user` may have a step relay on."""
    head, dot, tail = subject.rpartition(".")
    return head == user_pty(user) and dot == "." and len(tail) == 32 and set(tail) <= _HEX
