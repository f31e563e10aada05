"""Ports for servers that are restarted on them (`shared/ports.py`): never one port
twice (a chaos run's NATS cluster once had two members on one port), and outside the
kernel's ephemeral range, where an outgoing connection could take one while its server
is down."""

from __future__ import annotations

import socket

import pytest

from shared import embedded, ports

RANGES: dict[str, tuple[tuple[int, int], list[range]]] = {
    "Linux's default range": ((32768, 60999), [range(20000, 32768), range(61000, 65536)]),
    "a range starting at the floor": ((20000, 60999), [range(61000, 65536)]),
    "a range ending at the top": ((40000, 65535), [range(20000, 40000)]),
    "a range below the floor": ((1024, 5000), [range(20000, 65536)]),
    "a range over nearly every port": ((20400, 65200), []),
    "a range over every port": ((1024, 65535), []),
}


@pytest.mark.parametrize("ephemeral,expected", RANGES.values(), ids=RANGES.keys())
def test_listen_ranges_lie_outside_the_ephemeral_range(
    ephemeral: tuple[int, int], expected: list[range]
) -> None:
    assert ports.listen_ranges(ephemeral) == expected


def test_server_ports_are_distinct_free_and_never_ephemeral() -> None:
    low, high = ports.ephemeral_range()
    chosen = [embedded.free_port() for _ in range(200)]
    assert len(set(chosen)) == len(chosen)
    assert not [p for p in chosen if low <= p <= high]
    for port in chosen[:20]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_nothing_can_be_found_for_falls_back_to_the_kernels_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    port = ports.listen_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
