"""Plumbing: the node agent's persisted worker table, and the pure rule that says what a
restarted agent does with each record.

Every worker has one folder under the node's state folder (`workers/<job>-<attempt>-<gen>`):

- `record.json` (`WorkerRecord`, written by the agent): the job, attempt, generation,
  the kernel boot it started in (the agent is handed the kernel's boot id), and once
  known the step supervisor's and the worker's pid, each with its start time (field
  22 of `/proc/<pid>/stat`, clock ticks since boot);
- `spec.json` (`StepSpec`): what the step supervisor (`stepd`) runs;
- `started.json` (`StepStarted`, by stepd): both pids, once the worker runs, and the
  job's cgroup (`cgroups.CgroupRef`) where it has one: every process of the job is
  found and killed through it, not only the leader's process group;
- `exit.json` (`StepExit`, by stepd): how the worker ended, and why (exited, fenced,
  stopped);
- `tasks/<pid>-<start>.json` (`ProcessRef`): written by agents before round 16 for each
  `srun --pty` task they ran as their own child, which died with them or ran on with
  nobody to relay it. An agent that finds such notes ends the tasks still alive
  (`tasks_left`), and so does `muster down`. Every step task, `--pty` ones included,
  now has a stepd and a folder of its own (`steps/`, beside `workers/`: step_tasks.py).

Every file is written atomically (a temporary file renamed over it), so a reader sees
the old record or the new one, never half. A pid alone is never trusted: a record names
a live process only if the pid's start time (and the kernel's boot id) still match, so a
reused pid cannot be taken for a worker. The agent removes a folder once the worker's
exit is reported; the node's `contact` file (touched whenever the agent reached the
control plane) is what every stepd fences on.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal as _signal
import time
from collections.abc import Iterator
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TypeVar

import msgspec

from services.launcher.cgroups import CgroupRef, kill, procs
from services.launcher.cgroups_core import Limits
from services.launcher.executor import RunAs, process_gone

S = TypeVar("S", bound=msgspec.Struct)
STEPD_RECORD_S = 5.0  # a stepd whose worker is gone writes its exit and ends within this


class ProcessRef(msgspec.Struct, frozen=True, kw_only=True):
    """One process, as the kernel names it: a pid and the tick it started at."""

    pid: int
    start: int


class StepSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one step supervisor runs ({spool} already substituted), and its fence."""

    argv: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    stdout: str
    stderr: str
    run_as: RunAs | None = None
    allow_root: bool = False
    append: bool = True
    contact: str  # the node's contact file
    fence_s: float
    grace_s: float  # SIGTERM -> SIGKILL when fenced or stopped by a signal to stepd
    isolation: Isolation | None = None
    # A step task (srun; step_tasks.py): forked inside its job's cgroup, which it neither
    # makes nor removes, and its end is its own process group's, not the cgroup's.
    join_cgroup: CgroupRef | None = None
    # `srun --pty`'s task: on a terminal stepd holds and serves (pty_task.py), of this
    # size (shared/pty_size.py; "" for the pty's default); stdout and stderr unused
    pty: bool = False
    pty_window: str = ""


class Isolation(msgspec.Struct, frozen=True, kw_only=True):
    """The worker's confinement on this node and the site hooks around it."""

    cgroups: bool = True  # a job cgroup when the node has usable cgroups
    require_cgroups: bool = False  # no usable cgroup: refuse to start (not run unconfined)
    cgroup_root: str = "muster"
    cgroup_name: str = ""
    limits: Limits = Limits()
    prolog: str = ""  # root, before the worker (a failure: not started, node drained)
    epilog: str = ""  # root, after the worker's last process
    task_prolog: str = ""  # as the user, just before the job's program
    hook_timeout_s: float = 60.0
    hook_env: dict[str, str] = {}


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    attempt: int
    generation: int
    boot_id: str  # the kernel boot the worker started in
    folder: str
    spool: str = ""
    stepd: ProcessRef | None = None
    worker: ProcessRef | None = None
    cgroup: CgroupRef | None = None


class StepStarted(msgspec.Struct, frozen=True, kw_only=True):
    stepd: ProcessRef
    worker: ProcessRef
    cgroup: CgroupRef | None = None


class Ending(StrEnum):
    EXITED = "exited"  # the job's script ended by itself
    FENCED = "fenced"  # the agent lost the control plane for fence_s: stepd stopped it
    STOPPED = "stopped"  # stepd was told to stop (SIGTERM), e.g. by `muster down`
    SPAWN_FAILED = "spawn_failed"  # the worker never started
    LOST = "lost"  # stepd is gone without a word (killed, or the node rebooted)


class StepExit(msgspec.Struct, frozen=True, kw_only=True):
    ending: Ending
    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    spawn_failed: str = ""
    mem_peak_bytes: int | None = None
    cpu_usec: int | None = None  # the CPU time the job's cgroup used on this node
    prolog_failed: bool = False  # spawn_failed says how: the node is to be drained
    epilog_failed: str = ""  # the epilog's failure, once the worker had ended


# --- the pure rule --------------------------------------------------------------------


class Verdict(StrEnum):
    REPORT = "report"  # its exit is recorded: report it, then forget the worker
    ADOPT = "adopt"  # its stepd still runs: watch it as if we had started it
    KILL_ORPHAN = "kill_orphan"  # stepd gone, worker alive, unsupervised: kill, report lost
    REPORT_LOST = "report_lost"  # nothing runs and nothing was recorded: report it lost


class Facts(msgspec.Struct, frozen=True, kw_only=True):
    """What the machine says of one record when the agent starts."""

    exit_recorded: bool
    same_boot: bool
    stepd_alive: bool
    worker_alive: bool


def judge(facts: Facts) -> Verdict:
    """What a restarted agent does with one worker record."""
    if facts.exit_recorded:
        return Verdict.REPORT
    if not facts.same_boot:
        return Verdict.REPORT_LOST  # a reboot ended every process; start ticks restart
    if facts.stepd_alive:
        return Verdict.ADOPT
    return Verdict.KILL_ORPHAN if facts.worker_alive else Verdict.REPORT_LOST


def lost_exit() -> StepExit:
    """How a worker whose supervisor vanished is reported: killed."""
    return StepExit(ending=Ending.LOST, signal=int(_signal.SIGKILL))


def fence_due(contact_age_s: float, fence_s: float) -> bool:
    return contact_age_s > fence_s


# --- the machine ----------------------------------------------------------------------


def start_time(pid: int, *, zombie_ok: bool = False) -> int | None:
    """Field 22 of /proc/<pid>/stat (ticks after boot); None if gone (or a zombie,
    unless `zombie_ok`: a child that ended before its parent looked is still itself)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name (field 2) may hold spaces and ')'
    if fields[0] == "X" or (fields[0] == "Z" and not zombie_ok):
        return None
    return int(fields[19])


def process_ref(pid: int, *, zombie_ok: bool = False) -> ProcessRef | None:
    start = start_time(pid, zombie_ok=zombie_ok)
    return None if start is None else ProcessRef(pid=pid, start=start)


def alive(ref: ProcessRef | None) -> bool:
    """`ref` still names the same live process (a reused pid has another start time)."""
    return ref is not None and start_time(ref.pid) == ref.start


def write_atomic(path: Path, data: bytes, *, durable: bool = False) -> None:
    """`data` in `path`, whole or not at all (a rename). `durable` also outlives a power
    loss (fsync): only a worker's exit needs to, since a reboot ends every process and
    the records of an earlier boot are judged by that alone (`judge`), while a killed
    agent or stepd finds what it wrote in the page cache. Each fsync on a start's path
    cost it milliseconds, and 80-150 ms on a busy disk."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    tmp.replace(path)


def write_struct(path: Path, value: msgspec.Struct, *, durable: bool = False) -> None:
    write_atomic(path, msgspec.json.encode(value), durable=durable)


def read_struct(path: Path, kind: type[S]) -> S | None:
    """The struct in `path`, None when missing or unreadable (never half-written)."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError):
        return None


def touch(path: Path) -> None:
    """Mark the control plane reached now (the contact file's mtime is the fact)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.utime(path)


def contact_age(path: Path, now: float, since: float) -> float:
    """Seconds since the agent last reached the control plane; a missing contact file
    counts from `since` (when the asker started)."""
    try:
        return now - path.stat().st_mtime
    except OSError:
        return now - since


def node_state_folder(state_dir: str | Path, node: str) -> Path:
    """Where a node agent keeps what must survive it (workers, contact, boots)."""
    return Path(state_dir).resolve() / "nodes" / node


class WorkerTable:
    """The worker folders under one node's state folder."""

    def __init__(self, state_folder: Path) -> None:
        self.state = state_folder
        self.root = state_folder / "workers"
        self.contact = state_folder / "contact"

    def folder(self, job_id: int, attempt: int, generation: int) -> Path:
        return self.root / f"{job_id}-{attempt}-{generation}"

    def save(self, record: WorkerRecord) -> None:
        folder = Path(record.folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_struct(folder / "record.json", record)

    def records(self) -> list[WorkerRecord]:
        found = []
        for folder in sorted(self.root.glob("*")):
            record = read_struct(folder / "record.json", WorkerRecord)
            if record is not None:
                found.append(record)
            elif folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)  # died before its first write
        return found

    @staticmethod
    def started(record: WorkerRecord) -> StepStarted | None:
        return read_struct(Path(record.folder) / "started.json", StepStarted)

    @staticmethod
    def exit_of(record: WorkerRecord) -> StepExit | None:
        return read_struct(Path(record.folder) / "exit.json", StepExit)

    @staticmethod
    def remove(record: WorkerRecord) -> None:
        shutil.rmtree(record.folder, ignore_errors=True)

    @staticmethod
    def add_task(record: WorkerRecord, ref: ProcessRef) -> Path:
        """Note a step task this job runs, as agents before round 16 did (the module doc)."""
        path = Path(record.folder) / "tasks" / f"{ref.pid}-{ref.start}.json"
        path.parent.mkdir(exist_ok=True)
        write_struct(path, ref)
        return path

    @staticmethod
    def tasks_left(record: WorkerRecord) -> list[ProcessRef]:
        """The step tasks noted in the record and still alive, their notes taken away."""
        folder = Path(record.folder) / "tasks"
        refs = [read_struct(path, ProcessRef) for path in sorted(folder.glob("*.json"))]
        shutil.rmtree(folder, ignore_errors=True)
        return [ref for ref in refs if ref is not None and alive(ref)]

    def with_pids(self, record: WorkerRecord) -> WorkerRecord:
        """The record with the pids stepd reported, if the record lacks them."""
        if record.worker is not None:
            return record
        started = self.started(record)
        if started is None:
            return record
        return msgspec.structs.replace(
            record, stepd=started.stepd, worker=started.worker, cgroup=started.cgroup
        )

    def facts(self, record: WorkerRecord, boot_id: str) -> Facts:
        # the processes are looked at before the exit file: a stepd that records its
        # exit and ends between the looks is then reported, never taken for lost
        stepd_alive = alive(record.stepd)
        worker_alive = alive(record.worker) or bool(record.cgroup and procs(record.cgroup))
        return Facts(
            exit_recorded=self.exit_of(record) is not None,
            same_boot=record.boot_id == boot_id,
            stepd_alive=stepd_alive,
            worker_alive=worker_alive,
        )


def kill_group(worker: ProcessRef | None, sig: int, cgroup: CgroupRef | None = None) -> bool:
    """Signal a worker's process group, only while its leader is the recorded process,
    and every process in the job's cgroup (its name is the job's alone, never reused)
    that left that group: each process gets `sig` once."""
    if not alive(worker):
        return cgroup is not None and kill(cgroup, sig) > 0
    assert worker is not None
    if cgroup is not None:
        kill(cgroup, sig, but_group=worker.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, sig)
    return True


async def killed(worker: ProcessRef | None, cgroup: CgroupRef | None = None) -> None:
    """SIGKILL a worker's group (and its cgroup, as `kill_group`); returns once the
    leader is gone (`gone`)."""
    kill_group(worker, _signal.SIGKILL, cgroup)
    await gone(worker)


async def gone(worker: ProcessRef | None) -> None:
    """Until the recorded process has ended. A kill lands a moment after it is sent,
    and what reports a worker or a task ended frees its GPUs (invariant 1): it reports
    after this, not after the kill."""
    if worker is not None:
        await process_gone(worker.pid, partial(alive, worker))


def stop_recorded_workers(state_dir: str | Path, grace_s: float = 5.0) -> list[int]:
    """Stop every worker recorded under any node of a local cluster's state folder
    (`muster down`): SIGTERM to each live worker group, step task and stepd, SIGKILL to
    what is left after `grace_s`. Returns the worker pids it signalled; records stay, so
    an agent started later still reports their exits."""
    records = list(_all_records(Path(state_dir)))
    hit = [r for r in records if kill_group(r.worker, _signal.SIGTERM, r.cgroup)]
    steps = list(_all_step_tasks(Path(state_dir)))  # srun's tasks, each under a stepd
    tasks = [task for r in records for task in WorkerTable.tasks_left(r)]  # --pty ones
    tasks += [s.worker for s in steps]
    for task in tasks:
        kill_group(task, _signal.SIGTERM)
    stepds = [*(r.stepd for r in records), *(s.stepd for s in steps)]
    _signal_stepds(stepds, _signal.SIGTERM)
    _wait_until_gone([*(r.worker for r in records), *tasks], grace_s)
    for r in records:
        kill_group(r.worker, _signal.SIGKILL, r.cgroup)
    for task in tasks:
        kill_group(task, _signal.SIGKILL)
    _wait_until_gone(stepds, STEPD_RECORD_S)  # each records its exit
    _signal_stepds(stepds, _signal.SIGKILL)
    return [r.worker.pid for r in hit if r.worker is not None]


def _signal_stepds(stepds: list[ProcessRef | None], sig: int) -> None:
    for stepd in stepds:
        if stepd is not None and alive(stepd):
            with contextlib.suppress(ProcessLookupError):
                os.kill(stepd.pid, sig)


def _wait_until_gone(refs: list[ProcessRef | None], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(ref) for ref in refs):
        time.sleep(0.05)


def _all_step_tasks(state_dir: Path) -> Iterator[StepStarted]:
    """The srun step tasks started under every node (step_tasks.py), but those whose
    exit is recorded."""
    for folder in sorted((state_dir.resolve() / "nodes").glob("*/steps/*")):
        started = read_struct(folder / "started.json", StepStarted)
        if started is not None and not (folder / "exit.json").exists():
            yield started


def _all_records(state_dir: Path) -> Iterator[WorkerRecord]:
    for node in sorted((state_dir.resolve() / "nodes").glob("*")):
        table = WorkerTable(node)
        for record in table.records():
            yield table.with_pids(record)
