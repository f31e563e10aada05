"""Shell: the step supervisor, one process per worker (`python -m services.launcher.stepd
<worker folder>`), as Slurm's slurmstepd is to slurmd.

The node agent starts it in its own session for every worker. It starts the job's
process group with `executor.spawn_worker` (run-as user, output files, environment from
the folder's `spec.json`), reports both pids in `started.json`, waits for the worker and
writes how it ended in `exit.json`, then exits. It does not need the agent: when the
agent dies, is restarted or hangs, the worker runs on and its exit is on disk for the
next agent to report.

Fencing: every `POLL_S` it looks at the node's contact file, which the agent touches
whenever it reached the control plane. Older than `fence_s`, the node has lost the
cluster (or its agent hangs) and the job is about to be restarted elsewhere, so stepd
stops the worker (SIGTERM, `grace_s`, SIGKILL) and records `fenced`. SIGTERM to stepd
itself stops the worker the same way (`stopped`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal as _signal
import sys
import time
from pathlib import Path

import uvloop

from services.launcher.executor import LaunchError, Worker, spawn_worker
from services.launcher.worker_table import (
    Ending,
    StepExit,
    StepSpec,
    StepStarted,
    contact_age,
    fence_due,
    process_ref,
    read_struct,
    write_struct,
)

log = logging.getLogger(__name__)
POLL_S = 0.25


async def supervise(folder: Path) -> StepExit:
    """Run the worker described in `folder` to its end; record and return how it ended."""
    spec = read_struct(folder / "spec.json", StepSpec)
    if spec is None:
        return _record(folder, StepExit(ending=Ending.SPAWN_FAILED, spawn_failed="no spec.json"))
    began = time.time()
    try:
        worker = await spawn_worker(
            spec.argv,
            spec.env,
            spec.workdir,
            spec.stdout,
            spec.stderr,
            spec.run_as,
            allow_root=spec.allow_root,
            append=spec.append,
        )
    except LaunchError as err:
        return _record(folder, StepExit(ending=Ending.SPAWN_FAILED, spawn_failed=str(err)))
    me, child = process_ref(os.getpid()), process_ref(worker.pid, zombie_ok=True)
    try:
        if me is None or child is None:
            raise OSError("the worker ended before it could be recorded")
        write_struct(folder / "started.json", StepStarted(stepd=me, worker=child))
    except OSError as err:
        # The record is gone (the agent gave up on this start): not ours to run.
        log.warning("cannot record the start, stopping the worker", extra={"error": str(err)})
        await worker.terminate(spec.grace_s)
    ending = await _until_ended(worker, spec, began)
    status = await worker.wait()
    return _record(
        folder,
        StepExit(
            ending=ending,
            exit_code=status.exit_code,
            signal=status.signal,
            oom_killed=status.oom_killed,
        ),
    )


async def _until_ended(worker: Worker, spec: StepSpec, began: float) -> Ending:
    """Wait for the worker; stop it when fenced or told to stop. Says which ended it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (_signal.SIGTERM, _signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ended = asyncio.ensure_future(worker.wait())
    try:
        while not ended.done():
            if stop.is_set():
                await worker.terminate(spec.grace_s)
                return Ending.STOPPED
            if fence_due(contact_age(Path(spec.contact), time.time(), began), spec.fence_s):
                log.warning("control plane unreachable: fencing the worker")
                await worker.terminate(spec.grace_s)
                return Ending.FENCED
            await asyncio.wait({ended}, timeout=POLL_S)
        return Ending.EXITED
    finally:
        await ended


def _record(folder: Path, ending: StepExit) -> StepExit:
    write_struct(folder / "exit.json", ending)
    return ending


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m services.launcher.stepd <worker folder>")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s stepd %(message)s")
    uvloop.run(supervise(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
