"""Shell: how a command tells the user what the API refused and what to change, shared
by the full commands (muster.client) and the lean ones (muster.lean)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # mypy takes it as true
if TYPE_CHECKING:
    from collections.abc import Sequence

# refusals of the request's key, where acting as a configured user is the way out
KEY_CODES = ("unknown_user", "unknown_key", "no_key", "user_mismatch")


class ApiRefused(Exception):
    """What the API (or the way to it) refused: the message says what to change."""

    def __init__(self, message: str, code: str, details: tuple[str, ...]) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def print_refusal(who: str, message: str, code: str, details: Sequence[str]) -> None:
    print(f"{who}: {message}", file=sys.stderr)
    for detail in details:
        if detail != message:
            print(f"  {detail}", file=sys.stderr)
    if code in KEY_CODES:
        print(
            "  (on the local cluster, act as one of deploy/local/cluster.toml's users, "
            "e.g. MUSTER_USER=alice)",
            file=sys.stderr,
        )
