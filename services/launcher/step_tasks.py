"""Plumbing: srun step tasks on one node, each under a stepd of its own (docs/steps.md).

A task is started the way a worker is: a folder holding `spec.json` (a `StepSpec` that
joins its job's cgroup instead of making one), a stepd from the agent's zygote that
spawns the task and writes `started.json`, waits for it and writes `exit.json`. The
folder is `steps/<job>-<attempt>-<generation>-<step>-<procid>` under the node's state
folder, beside the worker folders rather than in one: a worker's folder goes as soon as
its exit is reported, while the stepds of its tasks are still recording theirs.
`task.json` (`TaskNote`) says whose task it is and, once forked, names its stepd.

So a task does not need the agent. An agent killed leaves it running under its stepd,
which records its exit, and fences it as it fences a worker when the node loses the
control plane. The next agent finds it here (`TaskFolders.found`) and waits on it
again, or reads how it ended meanwhile.
"""

from __future__ import annotations

import asyncio
import shutil
import signal as _signal
from pathlib import Path

import msgspec

from services.launcher.executor import process_gone
from services.launcher.stepd_client import Stepd
from services.launcher.worker_table import (
    STEPD_RECORD_S,
    ProcessRef,
    StepExit,
    StepSpec,
    StepStarted,
    kill_group,
    killed,
    lost_exit,
    process_ref,
    read_struct,
    write_struct,
)

StepKey = tuple[int, int, int, int]  # job, attempt, generation, step id


class TaskNote(msgspec.Struct, frozen=True, kw_only=True):
    """Whose task a folder holds, and its stepd once forked."""

    job_id: int
    attempt: int
    generation: int
    step_id: int
    procid: int
    output_dir: str  # srun's output folder: what a stop (srun's Ctrl-C) names
    stepd: ProcessRef | None = None
    pty: str = ""  # `srun --pty`: the bus subject its terminal is relayed on
    kill_on_bad_exit: bool = False  # srun -K: a bad exit here ends the step's others

    @property
    def key(self) -> StepKey:
        return (self.job_id, self.attempt, self.generation, self.step_id)


class TaskFolders:
    """The task folders under one node's state folder."""

    def __init__(self, state_folder: Path) -> None:
        self.root = state_folder / "steps"

    def create(self, note: TaskNote, spec: StepSpec) -> Path:
        """A fresh folder for `note`'s task, its spec written: ready for a stepd."""
        name = f"{note.job_id}-{note.attempt}-{note.generation}-{note.step_id}-{note.procid}"
        folder = self.root / name
        shutil.rmtree(folder, ignore_errors=True)  # a launch that failed before, half made
        folder.mkdir(parents=True)
        write_struct(folder / "spec.json", spec)
        write_struct(folder / "task.json", note)
        return folder

    def found(self) -> list[tuple[Path, TaskNote]]:
        """Every folder with its note, in name order; one without a note (its agent died
        before the first write) is removed: nothing was started from it."""
        out = []
        for folder in sorted(self.root.glob("*")):
            note = read_struct(folder / "task.json", TaskNote)
            if note is not None:
                out.append((folder, note))
            elif folder.is_dir():
                shutil.rmtree(folder, ignore_errors=True)
        return out

    @staticmethod
    def remove(folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)


class StepTask:
    """One task and its stepd: wait for its end, or stop it."""

    def __init__(self, folder: Path, note: TaskNote, stepd: Stepd) -> None:
        self.folder = folder
        self.note = note
        self.stepd = stepd
        self._exit: asyncio.Future[StepExit] | None = None

    @classmethod
    def forked(cls, folder: Path, note: TaskNote, stepd: Stepd) -> StepTask:
        """A task whose stepd was just handed its folder: the note names it from now on
        (a cold-started stepd, our child, by its pid and start tick read now)."""
        ref = stepd.ref or process_ref(stepd.pid)
        if ref is not None:
            note = msgspec.structs.replace(note, stepd=ref)
            write_struct(folder / "task.json", note)
        return cls(folder, note, stepd)

    @classmethod
    def left(cls, folder: Path, note: TaskNote) -> StepTask | None:
        """A task an earlier agent started, by its stepd (from the note or stepd's own
        word); None when no stepd was ever named, so none runs the task: a stepd that was
        being forked as that agent died finds the folder gone and stops what it began."""
        ref = note.stepd
        if ref is None:
            started = read_struct(folder / "started.json", StepStarted)
            ref = started.stepd if started is not None else None
        if ref is None and read_struct(folder / "exit.json", StepExit) is None:
            return None
        return cls(folder, note, Stepd(ref.pid if ref else 0, ref=ref))

    async def ended(self) -> StepExit:
        """How the task ended, once it has (read once, shared by every caller)."""
        if self._exit is None:
            self._exit = asyncio.ensure_future(self._wait())
        return await asyncio.shield(self._exit)

    async def _wait(self) -> StepExit:
        stepd = self.stepd
        if stepd.pid:
            await process_gone(stepd.pid, stepd.running)
        ending = read_struct(self.folder / "exit.json", StepExit)
        if ending is not None:
            return ending
        # stepd killed under its task (or gone before a word): nobody supervises it now;
        # reported lost once it is gone (`killed`)
        started = read_struct(self.folder / "started.json", StepStarted)
        if started is not None:
            await killed(started.worker)
        return lost_exit()

    def stop(self) -> None:
        """SIGTERM to stepd: it stops the task (its spec's grace, then SIGKILL) and
        records the exit."""
        self.stepd.stop()

    def signal(self, sig: int) -> bool:
        """`sig` to the task's process group, stopping nothing (its stepd sees the task
        end only if the task lets the signal end it); False: not started, or gone."""
        started = read_struct(self.folder / "started.json", StepStarted)
        return started is not None and kill_group(started.worker, sig)

    async def terminate(self, grace_s: float) -> StepExit:
        """Stop the task; past `grace_s` and stepd's time to record, kill both."""
        self.stop()
        try:
            return await asyncio.wait_for(self.ended(), grace_s + STEPD_RECORD_S)
        except TimeoutError:
            started = read_struct(self.folder / "started.json", StepStarted)
            if started is not None:
                kill_group(started.worker, _signal.SIGKILL)
            self.stepd.kill()
            return await self.ended()

    def remove(self) -> None:
        TaskFolders.remove(self.folder)
