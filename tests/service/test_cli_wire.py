"""muster.wire, the CLI's blocking NATS request, against a real NATS server: a reply of
any size comes back whole, nobody subscribed is NoResponders (the server's 503), and a
silent responder is a TimeoutError."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg

from muster import wire

BIG = bytes(range(256)) * 1024  # 256 KiB: read across many socket reads


async def test_a_reply_of_any_size_comes_back_whole(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data[::-1] + BIG)

        await nc.subscribe("muster.test.echo", cb=echo)
        await nc.flush()
        got = await asyncio.to_thread(
            wire.request, [nats_url], "muster.test.echo", b"abc", timeout=30
        )
    finally:
        await nc.close()
    assert got == b"cba" + BIG


async def test_nobody_subscribed_is_no_responders(nats_url: str) -> None:
    with pytest.raises(wire.NoResponders):
        await asyncio.to_thread(wire.request, [nats_url], "muster.test.nobody", b"", timeout=30)


async def test_a_silent_responder_is_a_timeout(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:

        async def ignore(msg: Msg) -> None:
            return None

        await nc.subscribe("muster.test.silent", cb=ignore)
        await nc.flush()
        with pytest.raises(TimeoutError):
            await asyncio.to_thread(
                wire.request, [nats_url], "muster.test.silent", b"", timeout=0.5
            )
    finally:
        await nc.close()


def test_no_server_is_unreachable_naming_every_url() -> None:
    with pytest.raises(wire.Unreachable, match=r"127.0.0.1:1, nats://127.0.0.1:2"):
        wire.request(["nats://127.0.0.1:1", "nats://127.0.0.1:2"], "x", b"", timeout=5)
