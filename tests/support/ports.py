"""Ports for tests that need a connection refused."""

from __future__ import annotations

import socket


def closed_port() -> int:
    """A port nothing listens on: a connection to it is refused at once (the kernel
    handed it out free a moment ago; nothing in a test run asks for it after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
