"""Shell: the supervisor of a local cluster, `python -m muster.supervisor`.

`muster up` starts the servers, writes what to run into the state folder's
`cluster.json` (`specs`: every service and node agent, and the NATS servers of a
three-server cluster) and leaves this small process in the background. It starts each
of them (adopting the servers `muster up` already started) and restarts any that
exits, whatever the exit status, with an exponential backoff that resets once a
process has stayed up (as systemd's `Restart=always` with `RestartSec` would). It
keeps every CURRENT pid in `cluster.json`, rewritten atomically at each start, so an
operator or a test can kill any of them. SIGTERM ends it and nothing else: `muster
down` stops it first, so nothing is restarted while the rest is stopped.

The backoff rule (`next_restart`) is pure, and table-tested.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from muster.cluster import Cluster, alive
from shared.logs import kv, setup_logging
from shared.settings import ToolSettings

log = logging.getLogger("muster.supervisor")  # also when run as __main__

POLL_S = 0.2  # how often exits are noticed
BASE_S = 0.5  # the first restart comes this soon after an exit
MAX_S = 30.0  # and no restart waits longer than this
STABLE_S = 10.0  # a process up this long starts its backoff afresh


@dataclass(frozen=True)
class Restart:
    delay_s: float  # wait this long before starting it again
    failures: int  # exits in a row, each within STABLE_S of its start


def next_restart(failures: int, ran_s: float) -> Restart:
    """After a process that ran `ran_s` exits, having failed quickly `failures` times in
    a row before: when to start it again."""
    failures = 1 if ran_s >= STABLE_S else failures + 1
    return Restart(delay_s=min(BASE_S * 2 ** (failures - 1), MAX_S), failures=failures)


@dataclass
class Watched:
    started: float
    failures: int = 0
    due: float | None = None  # when to start it again; None while it runs


def supervise(cluster: Cluster, stop: threading.Event) -> None:
    """Start every process of `cluster.specs` and keep them running until `stop`."""
    watched: dict[str, Watched] = {}
    for key in sorted(cluster.specs):
        if not _running(cluster, key):  # `muster up` started the servers: adopted
            cluster.respawn(key)
        watched[key] = Watched(started=time.monotonic())
    cluster.save()
    log.info("supervising", extra=kv(processes=len(watched)))
    while not stop.wait(POLL_S):
        now = time.monotonic()
        restarted = False
        for key, w in watched.items():
            if w.due is None:
                if _running(cluster, key):
                    continue
                code = cluster.procs[key].poll() if key in cluster.procs else None
                plan = next_restart(w.failures, now - w.started)
                w.failures, w.due = plan.failures, now + plan.delay_s
                log.warning(
                    "process exited; restarting",
                    extra=kv(process=key, code=code, delay_s=plan.delay_s),
                )
            if w.due is not None and now >= w.due:
                pid = cluster.respawn(key)
                w.started, w.due, restarted = now, None, True
                log.info("process restarted", extra=kv(process=key, pid=pid))
        if restarted:
            cluster.save()


def _running(cluster: Cluster, key: str) -> bool:
    """Whether process `key` runs: ours by its exit status, an adopted one (not our
    child: a server `muster up` started) by its pid."""
    proc = cluster.procs.get(key)
    if proc is not None:
        return proc.poll() is None
    pid = cluster.pids.get(key)
    return pid is not None and alive(pid)


def main() -> None:
    settings = ToolSettings.from_env(os.environ)
    state_dir = Path(settings.state_dir)
    setup_logging(settings.log_level, settings.service_name)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster.load(state_dir)
    cluster.pids["supervisor"] = os.getpid()
    supervise(cluster, stop)
    log.info("supervisor stopped; the processes it started keep running")


if __name__ == "__main__":
    main()
