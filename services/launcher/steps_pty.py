"""Node shell: the agent's relay of an `srun --pty` task's terminal (docs/steps.md).

The task runs under its stepd, which holds the pty (pty_task.py) and serves it on a
unix socket in the task's folder. The agent connects and relays: what the task writes
to the terminal is published on `<subject>.out`; what srun publishes on `<subject>.in`
is typed into it, but for a message carrying srun's window size (shared/pty_size.py),
which is set on the pty. Each `.in` message srun sends is a request, answered once its
keys are written to stepd's socket (muster/pty_keys.py: srun asks again while no relay
listens, so keys typed while the agent restarts are not lost). The subject is srun's
own random name; it is not a credential (see docs/steps.md). The relay ends when stepd
closes the socket (the task ended and its last output was sent) or is gone; a
restarted agent relays again from where the terminal is then, the output printed
meanwhile first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from services.launcher.pty_task import ACK, COUNT, KEYS, WINDOW, frame, reachable
from shared import pty_size
from shared.bus import Bus
from shared.logs import kv

log = logging.getLogger(__name__)
_CHUNK = 65536


async def relay(bus: Bus, subject: str, socket: Path) -> None:
    """Terminal bytes out to srun and srun's keys in, until stepd closes the terminal.
    A terminal no longer served (its stepd gone) is not relayed."""
    try:
        with reachable(socket) as name:
            reader, writer = await asyncio.open_unix_connection(name)
    except OSError as err:
        log.info("terminal not served", extra=kv(socket=str(socket), error=str(err)))
        return
    nc = bus.nc

    async def typed(msg: object) -> None:
        headers = getattr(msg, "headers", None) or {}
        if pty_size.WINDOW_HEADER in headers:
            writer.write(frame(WINDOW, headers[pty_size.WINDOW_HEADER].encode()))
        else:
            writer.write(frame(KEYS, getattr(msg, "data", b"")))
        if reply := getattr(msg, "reply", ""):  # srun asks until a relay has them
            with contextlib.suppress(Exception):  # stepd gone, or the bus: srun's
                await writer.drain()  # answer then never comes, and it does not resend
                await nc.publish(reply, b"")

    try:
        sub = await nc.subscribe(subject + ".in", cb=typed)
    except Exception as err:  # the bus closed under us (the agent stopping)
        log.warning("terminal not relayed", extra=kv(subject=subject, error=str(err)))
        writer.close()
        return
    try:
        read = 0
        while data := await reader.read(_CHUNK):
            await nc.publish(subject + ".out", data)
            read += len(data)
            writer.write(frame(ACK, COUNT.pack(read)))  # stepd may let these bytes go
        with contextlib.suppress(Exception):  # the bus is down: what it holds goes later
            await nc.flush()
    except ConnectionError:
        pass  # stepd went without closing (killed): the task is reported as it ended
    except Exception as err:  # the bus refused (closed, its buffer full): the terminal
        # goes unrelayed, the task runs on and its exit is still reported
        log.warning("terminal relay stopped", extra=kv(subject=subject, error=str(err)))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        writer.close()
