"""Ports for the servers we start and restart: NATS, PostgreSQL, the gateway, /metrics.

Two ways the kernel's own choice (`bind(0)`, then close) fails these servers:

- Asked twice in a row, it may give the same port twice: a chaos run's three-server
  NATS cluster had two members configured on one port, and the second died with
  "bind: address already in use".
- Its choice lies in the ephemeral range, the range every outgoing connection takes
  its local port from. A server restarted after a crash must get its old port back
  (its URL is in every client's configuration and in the state file); while it was
  down, any connection made on the machine (a NATS route, a client) may have taken it.

So these ports are chosen at random outside that range, where no outgoing connection
is ever put, and never handed out twice by one process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT = (32768, 60999)
# Below this lie the well-known and commonly configured service ports, and the ports
# Ray gives its workers by default (10002-19999), which a Ray job on a node may take.
FLOOR = 20000
# Fewer ports than this outside the ephemeral range: take what the kernel gives.
ENOUGH = 1000

_rng = random.Random()  # its own: a test that seeds `random` must not pick our ports
_handed_out: set[int] = set()


def listen_ranges(ephemeral: tuple[int, int], floor: int = FLOOR) -> list[range]:
    """The ports at or above `floor` outside the ephemeral range `ephemeral` (its
    inclusive bounds, as the kernel prints them); empty when fewer than ENOUGH."""
    low, high = ephemeral
    ranges = [range(floor, max(floor, low)), range(max(floor, high + 1), 65536)]
    ranges = [r for r in ranges if len(r)]
    return ranges if sum(len(r) for r in ranges) >= ENOUGH else []


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT
    return low, high


def bindable(port: int) -> bool:
    """Whether nothing is bound to `port` on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listen_port(attempts: int = 200) -> int:
    """A port on 127.0.0.1 nothing is bound to now, outside the ephemeral range, and
    not handed out before by this process (the ports of a cluster are all chosen
    before any of its servers binds one). Nothing holds it once returned: the caller
    starts its server on it at once."""
    ranges = listen_ranges(ephemeral_range())
    if ranges:
        for _ in range(attempts):
            chosen = _rng.choice(ranges)
            port = _rng.randrange(chosen.start, chosen.stop)
            if port not in _handed_out and bindable(port):
                _handed_out.add(port)
                return port
    # No room outside the ephemeral range (or all of it busy): the kernel's choice,
    # which a restart may find taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    _handed_out.add(port)
    return port
