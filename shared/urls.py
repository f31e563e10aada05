"""Pure: the servers a NATS URL setting names (kept apart from shared.settings, whose
msgspec a one-shot CLI command does not load)."""

from __future__ import annotations


def nats_servers(url: str) -> list[str]:
    """The servers a NATS URL setting names: one URL, or several comma-separated (a
    cluster: a client connects to any of them and fails over to the others)."""
    return [u.strip() for u in url.split(",") if u.strip()]
