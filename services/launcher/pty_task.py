"""Shell: an `srun --pty` task's terminal, held by the task's stepd (docs/steps.md).

stepd starts the task on a fresh pty (its controlling terminal, in a session of its
own) and keeps the master end, so the terminal outlives the node agent as the task
does. The agent relays it to srun over the bus (steps_pty.py) through a unix socket in
the task's folder, `pty.sock`, that only root may open. From stepd come the terminal's
bytes as they are printed; to stepd go frames (`frame`: a kind byte, a length, the
bytes): KEYS typed into the terminal, or WINDOW, a size (shared/pty_size.py) set on the
pty, so the task gets SIGWINCH.

One agent at a time: a new connection (the next agent's) replaces the last. The agent
acknowledges what it has published (ACK, the count of bytes it read on its connection),
and stepd keeps the output not yet acknowledged, its last `BACKLOG` bytes, for the next
agent: output printed while no agent ran, and what went to an agent killed before it
published it, reach srun (a few bytes twice at worst: published, the agent killed
before its ACK). Once the task has ended, stepd waits up to `LINGER_S` for an agent to
take the rest (one restarting), then exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import subprocess
import termios
from collections.abc import Iterator, Mapping
from pathlib import Path

from services.launcher import cgroups
from services.launcher.executor import RunAs, SpawnFailed, Worker
from shared import pty_size
from shared.waits import woken

SOCKET = "pty.sock"  # in the task's folder
KEYS, WINDOW, ACK = b"k", b"w", b"a"  # frames to stepd: typed, a size, bytes published
HEADER = struct.Struct("!cI")  # kind, length
COUNT = struct.Struct("!Q")  # an ACK's payload
MAX_FRAME = 1 << 20  # a longer frame is not an agent's: the connection is dropped
BACKLOG = 1 << 20  # output kept until acknowledged (the newest; a read more when waited on)
DRAIN_S = 2.0  # after the task ended: how long its terminal's last output may take
LINGER_S = 30.0  # after that: how long output no agent took waits for one
_CHUNK = 65536


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


@contextlib.contextmanager
def reachable(path: Path) -> Iterator[str]:
    """A name `path` is bound or connected by: a unix socket's name is at most 107
    bytes, so a longer one is reached through its folder, held open while in use."""
    if len(os.fsencode(path)) < 100:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)


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
    if not argv:
        raise SpawnFailed("", "empty command line")
    master, slave = os.openpty()
    set_window(master, window)
    switch = run_as is not None and run_as.uid != os.geteuid()
    uid = run_as.uid if switch and run_as else None
    gid = run_as.gid if switch and run_as else None
    groups = list(run_as.groups) if switch and run_as else None
    try:
        hierarchy = cgroups.detect() if cgroup is not None else None
        with cgroups.entered_if(cgroup, hierarchy):
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
    except (OSError, cgroups.CgroupError) as err:
        os.close(master)
        raise SpawnFailed(argv[0], str(err)) from err
    finally:
        os.close(slave)
    return Worker(proc, oom_events=None), master


def set_window(master: int, header: str) -> None:
    """A size srun's terminal has, on the task's pty (ignored when malformed)."""
    size = pty_size.decode(header)
    if size is None:
        return
    with contextlib.suppress(OSError):
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))


class Terminal:
    """The task's pty master, served on `path` to one agent at a time."""

    def __init__(self, master: int, path: Path) -> None:
        self.master = master
        self.path = path
        self.unacked = bytearray()  # output no agent acknowledged yet
        self.base = 0  # the offset of its first byte in all the terminal printed
        self.agent: asyncio.StreamWriter | None = None
        self.changed = asyncio.Event()  # an agent came or acknowledged
        self.closed = asyncio.Event()  # the pty gave EOF: no process holds the terminal
        self.paused = False  # the terminal is not read: the agent is not keeping up
        self._server: asyncio.AbstractServer | None = None
        self._serving: set[asyncio.Task[None]] = set()  # one per connection

    async def open(self) -> None:
        """Listen (before the task's start is recorded: an agent finds the socket) and
        read the terminal from now on."""
        self.path.unlink(missing_ok=True)
        with reachable(self.path) as name:
            self._server = await asyncio.start_unix_server(self._served, path=name)
        os.chmod(self.path, 0o600)
        asyncio.get_running_loop().add_reader(self.master, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.master, _CHUNK)
        except OSError:  # EIO: the last holder of the terminal closed it
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(self.master)
            self.closed.set()
            return
        agent = self.agent
        if agent is not None and not agent.is_closing():
            agent.write(data)
        self.unacked += data
        if self.agent is None and len(self.unacked) > BACKLOG:  # nobody to wait for
            dropped = len(self.unacked) - BACKLOG
            del self.unacked[:dropped]
            self.base += dropped
        self._flow()

    def _flow(self) -> None:
        """Flow control: an agent connected but not keeping up (hung, stopped) stops the
        terminal's reading once a `BACKLOG` is unacknowledged, so the task's writes
        block as on a real terminal, and stepd's memory stays bounded; half of it
        acknowledged, or that agent gone, the reading goes on. With no agent connected
        it never stops (the oldest output goes instead)."""
        if self.closed.is_set():
            return
        loop = asyncio.get_running_loop()
        if not self.paused and self.agent is not None and len(self.unacked) >= BACKLOG:
            self.paused = True
            loop.remove_reader(self.master)
        elif self.paused and (self.agent is None or len(self.unacked) <= BACKLOG // 2):
            self.paused = False
            loop.add_reader(self.master, self._readable)

    def _acked(self, offset: int) -> None:
        cut = min(offset - self.base, len(self.unacked))
        if cut > 0:
            del self.unacked[:cut]
            self.base += cut
            self.changed.set()
            self._flow()

    async def _served(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        serving = asyncio.current_task()
        if serving is not None:
            self._serving.add(serving)
            serving.add_done_callback(self._serving.discard)
        last, self.agent = self.agent, writer
        if last is not None:
            last.close()
        since = self.base  # the offset of the first byte this agent reads
        writer.write(bytes(self.unacked))
        self.changed.set()
        try:
            while True:
                kind, size = HEADER.unpack(await reader.readexactly(HEADER.size))
                if size > MAX_FRAME:
                    break
                payload = await reader.readexactly(size)
                if kind == ACK and size == COUNT.size:
                    self._acked(since + COUNT.unpack(payload)[0])
                elif kind == WINDOW:
                    set_window(self.master, payload.decode(errors="replace"))
                elif kind == KEYS:
                    with contextlib.suppress(OSError):
                        os.write(self.master, payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # that agent is gone (killed, restarted) or done
        finally:
            if self.agent is writer:
                self.agent = None
                self._flow()
            writer.close()

    async def finish(self, stop: asyncio.Event, linger_s: float = LINGER_S) -> None:
        """The task has ended: its terminal's last output is taken by an agent (waited
        for up to `linger_s`; `stop` cuts that short), then the socket and the pty are
        closed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.closed.wait(), DRAIN_S)
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.master)
        self.closed.set()  # read no more (`_flow` included)
        deadline = loop.time() + linger_s
        while self.unacked and not stop.is_set() and loop.time() < deadline:
            self.changed.clear()
            await woken(self.changed, stop, deadline - loop.time())
        agent = self.agent
        if agent is not None:
            agent.close()  # what it was sent goes first, unless it stopped reading
            try:
                await asyncio.wait_for(agent.wait_closed(), DRAIN_S)
            except (TimeoutError, ConnectionError):
                agent.transport.abort()
        if self._server is not None:
            self._server.close()
        if self._serving:  # each sees its connection closed
            _, left = await asyncio.wait(set(self._serving), timeout=DRAIN_S)
            for serving in left:
                serving.cancel()
        self.path.unlink(missing_ok=True)
        os.close(self.master)
