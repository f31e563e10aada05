"""Node shell: `srun --pty` — one step task on a terminal (docs/steps.md).

The task runs on a fresh pty (its controlling terminal, in its own session) as the
job's user, inside the job's cgroup when it has one. What it writes to the terminal is
published on `<subject>.out`; what srun publishes on `<subject>.in` is typed into it,
but for a message carrying srun's window size (shared/pty_size.py), which is set on the
pty (the task gets SIGWINCH). The subject is srun's own random name; it is not a
credential (see docs/steps.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from collections.abc import Mapping

from services.launcher import cgroups
from services.launcher.executor import RunAs, Worker
from shared import pty_size
from shared.bus import Bus

_CHUNK = 65536


def _make_controlling_tty() -> None:  # in the child, after setsid
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def spawn_on_pty(
    argv: tuple[str, ...],
    env: Mapping[str, str],
    workdir: str,
    run_as: RunAs | None,
    cgroup: cgroups.CgroupRef | None,
    window: str = "",
) -> tuple[Worker, int]:
    """The task and the pty's master end; the pty of `window`'s size when it is one."""
    master, slave = os.openpty()
    set_window(master, window)
    switch = run_as is not None and run_as.uid != os.geteuid()
    uid = run_as.uid if switch and run_as else None
    gid = run_as.gid if switch and run_as else None
    groups = list(run_as.groups) if switch and run_as else None
    hierarchy = cgroups.detect() if cgroup is not None else None
    inside = cgroups.entered_if(cgroup, hierarchy)
    try:
        with inside:
            proc = subprocess.Popen(
                list(argv),
                env={**env, "TERM": env.get("TERM", "xterm")},
                cwd=workdir or "/",
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_make_controlling_tty,
                close_fds=True,
                user=uid,
                group=gid,
                extra_groups=groups,
            )
    finally:
        os.close(slave)
    return Worker(proc, oom_events=None), master


async def relay(bus: Bus, subject: str, master: int, worker: Worker) -> None:
    """Terminal bytes out to srun and srun's keys in, until the task ends."""
    loop = asyncio.get_running_loop()
    nc = bus.nc

    async def typed(msg: object) -> None:
        headers = getattr(msg, "headers", None) or {}
        if pty_size.WINDOW_HEADER in headers:
            set_window(master, headers[pty_size.WINDOW_HEADER])
            return
        data: bytes = getattr(msg, "data", b"")
        with contextlib.suppress(OSError):
            os.write(master, data)

    sub = await nc.subscribe(subject + ".in", cb=typed)
    out: asyncio.Queue[bytes] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(master, _CHUNK)
        except OSError:  # EIO: the task closed its terminal
            data = b""
        if not data:
            loop.remove_reader(master)
        out.put_nowait(data)

    loop.add_reader(master, readable)

    async def pump() -> None:
        while data := await out.get():
            await nc.publish(subject + ".out", data)

    pumping = asyncio.create_task(pump())
    try:
        await worker.wait()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pumping), timeout=2.0)  # its last bytes
        await nc.flush()
    finally:
        loop.remove_reader(master)
        pumping.cancel()
        await sub.unsubscribe()
        os.close(master)


def set_window(master: int, header: str) -> None:
    """The size srun's terminal has now, on the task's pty (ignored when malformed)."""
    size = pty_size.decode(header)
    if size is None:
        return
    with contextlib.suppress(OSError):
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
