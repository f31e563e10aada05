"""A terminal step's relay (services/launcher/steps_pty.py) on a real NATS server and a
real pty: what the task prints reaches `<subject>.out`, what is published on `.in` is
typed into it, and a message carrying srun's window size (shared/pty_size.py) is set on
the pty instead, so the task reads the new size; a malformed size is ignored. The pty
starts at the size srun's request gave."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import nats

from services.launcher.steps_pty import relay, spawn_on_pty
from shared import pty_size
from shared.bus import Bus

TASK = "stty size; echo ready; read x; stty size; read y; stty size; exit 3"


async def test_the_relay_types_keys_and_sets_the_window_size_srun_sends(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    subject = f"muster.pty.test.{os.urandom(16).hex()}"
    client = await nats.connect(nats_url)
    shown = bytearray()
    seen = asyncio.Event()

    async def out(msg: nats.aio.msg.Msg) -> None:
        shown.extend(msg.data)
        seen.set()

    await client.subscribe(subject + ".out", cb=out)
    await client.flush()
    env = dict(os.environ)
    worker, master = spawn_on_pty(("sh", "-c", TASK), env, str(tmp_path), None, None, "30 90")
    relaying = asyncio.create_task(relay(bus, subject, master, worker))
    try:

        async def printed(text: bytes) -> None:
            while text not in shown:
                seen.clear()
                await asyncio.wait_for(seen.wait(), 10)

        await printed(b"ready")  # the relay subscribed to `.in` before it sent anything
        window = {pty_size.WINDOW_HEADER: pty_size.encode(40, 120)}
        await client.publish(subject + ".in", b"", headers=window)
        await client.publish(subject + ".in", b"\r")
        await printed(b"40 120")
        bad = {pty_size.WINDOW_HEADER: "0 99999"}
        await client.publish(subject + ".in", b"", headers=bad)
        await client.publish(subject + ".in", b"\r")
        await asyncio.wait_for(relaying, 10)
    finally:
        relaying.cancel()
        await client.close()
    end = await worker.wait()
    lines = bytes(shown).replace(b"\r", b"").split(b"\n")
    sizes = [line for line in lines if line and line[0:1].isdigit()]
    assert sizes[0] == b"30 90"  # the size srun's request gave the step
    assert sizes[1:] == [b"40 120", b"40 120"]  # and the malformed one changed nothing
    assert end.exit_code == 3
