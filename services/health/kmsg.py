"""Plumbing: follow a kernel log in a thread and hand each line to a callback.

`/dev/kmsg` (a character device: one record per `read`, `EPIPE` when the ring buffer
overwrote records we had not read) or a plain file that something appends to (a test,
`journalctl -k -f > file`, a container without /dev/kmsg). Both start at the end: faults
logged before the probe started belong to an earlier boot or were already reported.
Reads block, so this runs in its own daemon thread and never on the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import stat
import threading
from collections.abc import Callable

from services.health.xid import parse_kmsg_record, sequence_gap, split_lines
from shared.logs import kv

log = logging.getLogger(__name__)

OnLine = Callable[[str], None]
_RECORD_MAX = 8192


class KernelLogFollower:
    def __init__(self, path: str, on_line: OnLine, *, poll_s: float = 0.05) -> None:
        self.path = path
        self.on_line = on_line
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            if stat.S_ISCHR(os.stat(self.path).st_mode):
                self._follow_device()
            else:
                self._follow_file()
        except OSError as err:
            log.error("cannot follow the kernel log", extra=kv(path=self.path, error=repr(err)))

    def _follow_device(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            os.lseek(fd, 0, os.SEEK_END)
            last_seq: int | None = None
            while not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], 0.2)
                if not ready:
                    continue
                try:
                    record = os.read(fd, _RECORD_MAX).decode(errors="replace")
                except BlockingIOError:
                    continue
                except OSError as err:
                    if err.errno == errno.EPIPE:  # overwritten before we read them
                        log.warning("kernel log records lost (ring buffer overrun)")
                        continue
                    raise
                parsed = parse_kmsg_record(record)
                if parsed is not None:
                    gap = sequence_gap(last_seq, parsed)
                    if gap:
                        log.warning("kernel log records lost", extra=kv(count=gap))
                    last_seq = parsed.sequence
                self.on_line(record.split("\n", 1)[0])
        finally:
            os.close(fd)

    def _follow_file(self) -> None:
        with open(self.path, encoding="utf-8", errors="replace") as f:
            f.seek(0, os.SEEK_END)
            pending = ""
            while not self._stop.is_set():
                chunk = f.read(65536)
                if not chunk:
                    with contextlib.suppress(OSError):
                        if os.stat(self.path).st_size < f.tell():  # truncated or rotated
                            f.seek(0)
                            pending = ""
                    self._stop.wait(self.poll_s)
                    continue
                lines, pending = split_lines(pending, chunk)
                for line in lines:
                    self.on_line(line)
