"""A consumer process for tests about replicas of one durable consumer: it consumes
`usage.ticked` with the product's bus settings (`Settings()`'s ack wait) and writes
each event's id to OUTFILE as it is handled, until SIGTERM.

    python -m tests.support.consumer NATS_URL DURABLE OUTFILE
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from shared.bus import Bus
from shared.events import AnyEvent
from shared.settings import Settings


async def main(url: str, durable: str, out: Path) -> None:
    settings = Settings()
    bus = await Bus.connect(url, name=durable, ack_wait_s=settings.ack_wait_s)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def handle(event: AnyEvent) -> None:
        with out.open("a") as f:
            f.write(f"{event.event_id}\n")

    try:
        with out.open("a") as f:
            f.write("ready\n")
        await bus.consume(durable, ("muster.usage.ticked",), handle, stop)
    finally:
        await bus.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
