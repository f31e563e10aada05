"""Shell: the step supervisor, one process per worker (`python -m services.launcher.stepd
<worker folder>`), as Slurm's slurmstepd is to slurmd.

The node agent's zygote (stepd_zygote.py) hands one to every worker, forked ahead, in
a session of its own (a cold `python -m services.launcher.stepd <folder>` when there is
no zygote). It starts the job's process group with `executor.spawn_worker` (run-as
user, output files, environment from the folder's `spec.json`), reports both pids in
`started.json`, waits for the worker and writes how it ended in `exit.json`, then
exits. It does not need the agent: when the agent dies, is restarted or hangs, the
worker runs on and its exit is on disk for the next agent to report.

Fencing: every `POLL_S` it looks at the node's contact file, which the agent touches
whenever it reached the control plane. Older than `fence_s`, the node has lost the
cluster (or its agent hangs) and the job is about to be restarted elsewhere, so stepd
stops the worker (SIGTERM, `grace_s`, SIGKILL) and records `fenced`. SIGTERM to stepd
itself stops the worker the same way (`stopped`). Either one that comes before the worker
is spawned (while the site prolog runs) means it never is: no line of the job runs.

Isolation (`spec.isolation`): stepd runs the site Prolog first (a failure: the worker
never starts, `prolog_failed`), makes the job's cgroup and forks the worker inside it,
and once the worker's last process is gone records the exit, removes the cgroup and
runs the Epilog.

An `srun --pty` task (`spec.pty`) is started on a terminal stepd holds and serves to the
agent (pty_task.py), not on output files; once its exit is recorded, stepd waits a while
for an agent to take the output none took yet (pty_task.LINGER_S).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal as _signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import msgspec
import uvloop

from services.launcher import cgroups
from services.launcher.executor import LaunchError, SpawnFailed, Worker, spawn_worker
from services.launcher.hooks import run_hook
from services.launcher.hooks_core import Hook, hook_env
from services.launcher.pty_task import SOCKET, Terminal, spawn_on_pty
from services.launcher.worker_table import (
    Ending,
    Isolation,
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
STOPS = frozenset({_signal.SIGTERM, _signal.SIGINT})  # what stops stepd and its worker
LOG_FORMAT = "%(asctime)s stepd %(message)s"  # each stepd's lines in its stepd.log


async def supervise(
    folder: Path, hierarchy: Callable[[], cgroups.Hierarchy | None] = cgroups.detect
) -> StepExit:
    """Run the worker described in `folder` to its end; record and return how it ended.
    `hierarchy`: this node's cgroup layout, asked only when the spec wants a cgroup."""
    stop = _stop_on_signals()
    spec = read_struct(folder / "spec.json", StepSpec)
    if spec is None:
        return _record(folder, StepExit(ending=Ending.SPAWN_FAILED, spawn_failed="no spec.json"))
    began = time.time()
    iso = spec.isolation or Isolation(cgroups=False)
    if (before := _not_to_start(spec, began, stop)) is not None:
        return _record(folder, StepExit(ending=before, signal=int(_signal.SIGTERM)))
    if iso.prolog:
        result = await run_hook(
            Hook.PROLOG, iso.prolog, _hook_env(spec, Hook.PROLOG), iso.hook_timeout_s
        )
        if not result.ok:
            failed = StepExit(
                ending=Ending.SPAWN_FAILED, spawn_failed=result.describe(), prolog_failed=True
            )
            return _record(folder, failed)
        if (during := _not_to_start(spec, began, stop)) is not None:  # the epilog runs:
            never = StepExit(ending=during, signal=int(_signal.SIGTERM))  # the prolog did
            return await _ended(folder, spec, never)
    try:
        layout, cgroup = _make_cgroup(iso, hierarchy)
    except cgroups.CgroupError as err:
        return await _ended(
            folder, spec, StepExit(ending=Ending.SPAWN_FAILED, spawn_failed=str(err))
        )
    joined = spec.join_cgroup
    if joined is not None:  # a step task: into its job's cgroup (see StepSpec)
        layout = hierarchy()
    terminal: Terminal | None = None
    try:
        if spec.pty:  # srun --pty: the task on a terminal this stepd holds and serves
            worker, master = spawn_on_pty(
                spec.argv, spec.env, spec.workdir, spec.run_as, joined, spec.pty_window
            )
            terminal = await _served(worker, master, folder / SOCKET)
        else:
            worker = await spawn_worker(
                spec.argv,
                spec.env,
                spec.workdir,
                spec.stdout,
                spec.stderr,
                spec.run_as,
                allow_root=spec.allow_root,
                append=spec.append,
                cgroup=cgroup or joined,
                hierarchy=layout,
                task_prolog=iso.task_prolog,
            )
    except LaunchError as err:
        if cgroup is not None:
            cgroups.remove(cgroup)
        return await _ended(
            folder, spec, StepExit(ending=Ending.SPAWN_FAILED, spawn_failed=str(err))
        )
    if joined is not None:
        worker.cgroup = None  # the task ends with its group; the job's cgroup is the job's
    me, child = process_ref(os.getpid()), process_ref(worker.pid, zombie_ok=True)
    try:
        if me is None or child is None:
            raise OSError("the worker ended before it could be recorded")
        write_struct(folder / "started.json", StepStarted(stepd=me, worker=child, cgroup=cgroup))
    except OSError as err:
        # The record is gone (the agent gave up on this start): not ours to run.
        log.warning("cannot record the start, stopping the worker", extra={"error": str(err)})
        await worker.terminate(spec.grace_s)
    ending = await _until_ended(worker, spec, began, stop)
    status = await worker.wait()
    if cgroup is not None:
        cgroups.remove(cgroup)
    exit_ = StepExit(
        ending=ending,
        exit_code=status.exit_code,
        signal=status.signal,
        oom_killed=status.oom_killed,
        mem_peak_bytes=status.mem_peak_bytes,
        cpu_usec=status.cpu_usec,
    )
    ended = await _ended(folder, spec, exit_)
    if terminal is not None:  # recorded first: a stepd killed while it lingers leaves it
        await terminal.finish(stop)
    return ended


async def _served(worker: Worker, master: int, socket: Path) -> Terminal:
    """The task's terminal, served to the agent; one that cannot be is a failed start
    (the task stopped at once: nobody could reach it)."""
    terminal = Terminal(master, socket)
    try:
        await terminal.open()
    except OSError as err:
        await worker.terminate(0.0)
        os.close(master)
        raise SpawnFailed("srun --pty", f"cannot serve its terminal: {err}") from err
    return terminal


def _make_cgroup(
    iso: Isolation, detect: Callable[[], cgroups.Hierarchy | None]
) -> tuple[cgroups.Hierarchy | None, cgroups.CgroupRef | None]:
    """The job's cgroup, when asked for and the node has usable cgroups."""
    if not iso.cgroups:
        return None, None
    hierarchy = detect()
    if hierarchy is None:
        if iso.require_cgroups:
            raise cgroups.CgroupError("/proc/self/mountinfo", "no usable memory cgroup")
        log.warning("no usable cgroup on this node: the worker runs unconfined")
        return None, None
    name = iso.cgroup_name or f"stepd-{os.getpid()}"
    try:
        return hierarchy, cgroups.create(
            hierarchy, iso.cgroup_root, name, iso.limits, strict=iso.require_cgroups
        )
    except cgroups.CgroupError as err:
        if iso.require_cgroups:
            raise
        log.warning("cannot make the job's cgroup: the worker runs unconfined: %s", err)
        return None, None


async def _ended(folder: Path, spec: StepSpec, ending: StepExit) -> StepExit:
    """Record how the worker ended, then run the Epilog (its exit is safe on disk
    first: a stepd killed during a hanging epilog still leaves it)."""
    _record(folder, ending)
    iso = spec.isolation
    if iso is None or not iso.epilog:
        return ending
    result = await run_hook(
        Hook.EPILOG, iso.epilog, _hook_env(spec, Hook.EPILOG), iso.hook_timeout_s
    )
    if result.ok:
        return ending
    log.warning("epilog failed", extra={"reason": result.describe()})
    return _record(folder, msgspec.structs.replace(ending, epilog_failed=result.describe()))


def _hook_env(spec: StepSpec, hook: Hook) -> dict[str, str]:
    iso = spec.isolation or Isolation()
    return hook_env(iso.hook_env or spec.env, spec.env.get("SLURMD_NODENAME", ""), hook)


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set from now on. Taken first thing: a stop that comes
    while the worker is being started (the agent's stop right after its start, `muster
    down`) is kept for `_until_ended`, where the default action would end stepd alone
    and leave the worker running with nobody to stop it or record its exit."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOPS:
        loop.add_signal_handler(sig, stop.set)
    # A zygote's spare is born with them blocked: one sent before this line is pending.
    # It is taken as a stop at once (the handler would run only on the loop's next turn,
    # after the look before the prolog), then let through; the worker inherits none.
    if _signal.sigpending() & STOPS:
        stop.set()
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, STOPS)
    return stop


def _not_to_start(spec: StepSpec, began: float, stop: asyncio.Event) -> Ending | None:
    """Why the worker is not to be spawned at all: a stop came first (a cancel, the
    agent stopping, while the site prolog ran), or the node lost the control plane
    meanwhile (its job is being restarted elsewhere). The exit is recorded with the
    SIGTERM a spawned worker would have had, and no line of the job runs."""
    if stop.is_set():
        return Ending.STOPPED
    if fence_due(contact_age(Path(spec.contact), time.time(), began), spec.fence_s):
        log.warning("control plane unreachable: the worker is not started")
        return Ending.FENCED
    return None


async def _until_ended(worker: Worker, spec: StepSpec, began: float, stop: asyncio.Event) -> Ending:
    """Wait for the worker; stop it when fenced or told to stop (`stop`, set by a
    signal, perhaps before the worker was spawned). Says which ended it."""
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
    try:
        write_struct(folder / "exit.json", ending, durable=True)  # reported after a reboot too
    except FileNotFoundError:  # the agent gave the start up and took its record away:
        log.warning("no record left to write the exit to")  # nobody asks; the epilog runs
    return ending


def run_folder(
    folder: Path,
    hierarchy: Callable[[], cgroups.Hierarchy | None],
    runner: asyncio.Runner | None = None,
) -> NoReturn:
    """Supervise `folder`'s worker to its end, then exit (`runner`: a loop built ahead,
    as a spare of the zygote has one)."""
    code = 1
    try:
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        runner = runner or asyncio.Runner(loop_factory=uvloop.new_event_loop)
        runner.run(supervise(folder, hierarchy))  # not closed: os._exit is its end
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        # Everything it owes is on disk (written atomically): skip the interpreter's
        # teardown, a tenth of a second the agent would wait for before it reports.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m services.launcher.stepd <worker folder>")
    run_folder(Path(sys.argv[1]), cgroups.detect)


if __name__ == "__main__":
    main()
