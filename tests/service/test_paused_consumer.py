"""Two replicas of one durable consumer, real processes on a real NATS: one is
SIGSTOPped while its pull is pending, so JetStream hands it an event it cannot
handle. That event waits out the ack deadline (`MUSTER_ACK_WAIT_S`) before the other
replica gets it: an XID's node event held by a paused health replica, a job's by a
paused launcher. 10 s now (the handlers' keeper extends the deadline of what a live
replica holds every third of it); 30 s before. Every event is handled."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from shared.bus import Bus
from shared.events import UsageTicked
from shared.settings import Settings
from tests.support.cluster import eventually

EVENTS = 20


def handled(out: Path) -> list[str]:
    return out.read_text().split() if out.exists() else []


async def test_an_event_a_paused_replica_took_is_handled_by_the_other_within_seconds(
    nats_url: str, tmp_path: Path
) -> None:
    bus = await Bus.connect(nats_url, name="publisher")
    await bus.ensure_streams()
    paused_out, live_out = tmp_path / "paused.txt", tmp_path / "live.txt"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.consumer", nats_url, "replicas", str(out)
        )
        for out in (paused_out, live_out)
    ]
    loop = asyncio.get_running_loop()
    late = 0.0
    try:
        await eventually(
            lambda: asyncio.to_thread(lambda: [handled(o) for o in (paused_out, live_out)]),
            lambda outs: all("ready" in o for o in outs),
            30,
            "both consumers started",
        )
        await asyncio.sleep(2.0)  # both bound, each with a pull pending
        for _ in range(5):  # until the paused one took an event (it almost always does)
            os.kill(procs[0].pid, signal.SIGSTOP)
            sent: dict[str, float] = {}
            for i in range(EVENTS):
                event = UsageTicked(
                    job_id=i, attempt=0, user="u", account="a", gpu_model="", gpu_seconds_total=1
                )
                await bus.publish(event)
                sent[str(event.event_id)] = loop.time()
                await asyncio.sleep(0.05)
            seen: dict[str, float] = {}
            deadline = loop.time() + 45
            while len(seen) < EVENTS and loop.time() < deadline:
                for event_id in handled(live_out):
                    if event_id in sent:
                        seen.setdefault(event_id, loop.time())
                await asyncio.sleep(0.1)
            os.kill(procs[0].pid, signal.SIGCONT)
            assert len(seen) == EVENTS, f"{EVENTS - len(seen)} events never handled"
            late = max(seen[e] - sent[e] for e in sent)
            if late > 2.0:  # one waited on the paused replica's ack deadline
                break
            await asyncio.sleep(2.0)
        assert late > 2.0, "the paused replica never took an event"
        assert late < 15.0, f"an event waited {late:.1f} s on a paused replica"
        assert Settings().ack_wait_s == 10.0
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 10)
        await bus.close()
