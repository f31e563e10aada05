"""Plumbing: what the machine says, read from `/proc` as `ps` does.

A job worker carries its identity in its environment (the launcher sets MUSTER_JOB_ID,
MUSTER_ATTEMPT, MUSTER_GENERATION, MUSTER_NODE and CUDA_VISIBLE_DEVICES for it and its
children inherit them), so `workers(workdir)` finds every live process of every job of
one chaos run (their working folder is the run's own, so another test's jobs with the
same ids on this machine are not taken for ours), whichever network namespace it runs
in. A process is named by its pid and its start tick, so a reused pid is another one.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class WorkerProc:
    pid: int
    start: int  # field 22 of /proc/<pid>/stat: with the pid, one process for ever
    node: str
    job_id: int
    attempt: int
    generation: int
    gpus: tuple[int, ...]
    started: float = 0.0  # wall clock, from its start tick and the kernel's boot

    @property
    def run(self) -> tuple[int, int, int]:
        return (self.job_id, self.attempt, self.generation)


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, start tick) of a process, None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def environ(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _booted_at() -> float:
    """The wall-clock moment of the kernel's boot, to 10 ms (/proc/stat's btime is whole
    seconds: too coarse to tell a start just after an ending from one just before)."""
    uptime = float((PROC / "uptime").read_text().split()[0])
    return time.time() - uptime


def _gpus(text: str) -> tuple[int, ...]:
    return tuple(sorted(int(g) for g in text.split(",") if g.strip().isdigit()))


def _worker(pid: int, workdir: str, booted: float) -> WorkerProc | None:
    try:
        cwd = os.readlink(PROC / str(pid) / "cwd")
    except OSError:
        return None
    if cwd != workdir:
        return None
    env = environ(pid)
    stat = _stat(pid)
    if "MUSTER_JOB_ID" not in env or stat is None or stat[0] in ("Z", "X"):
        return None
    return WorkerProc(
        pid=pid,
        start=stat[1],
        node=env.get("MUSTER_NODE", ""),
        job_id=int(env["MUSTER_JOB_ID"]),
        attempt=int(env.get("MUSTER_ATTEMPT", "0")),
        generation=int(env.get("MUSTER_GENERATION", "0")),
        gpus=_gpus(env.get("CUDA_VISIBLE_DEVICES", "")),
        started=booted + stat[1] / TICKS,
    )


def workers(workdir: Path) -> list[WorkerProc]:
    """Every live process of a job whose working folder is `workdir`."""
    folder = str(workdir.resolve())
    booted = _booted_at()
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            proc = _worker(int(entry.name), folder, booted)
            if proc is not None:
                found.append(proc)
    return found


def still_alive(proc: WorkerProc) -> bool:
    """Whether this very process (pid and start tick) still runs."""
    stat = _stat(proc.pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == proc.start


def node_processes(node: str, state_dir: Path, workdir: Path) -> list[int]:
    """Every live process of one node of the run: its agent, the agent's stepd zygote
    and stepds (they carry the agent's `MUSTER_NODE` and `MUSTER_STATE_DIR`), and the
    workers and step tasks on that node (`workers`). What a crash of the node ends."""
    state, folder = str(state_dir), str(workdir.resolve())
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        env = environ(int(entry.name))
        if env.get("MUSTER_NODE") != node:
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if env.get("MUSTER_STATE_DIR") == state or cwd == folder:
            found.append(int(entry.name))
    return found
