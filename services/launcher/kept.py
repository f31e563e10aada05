"""Node shell: what the node agent must remember across its own restarts, on disk.

The agent refuses a start of a generation it was told to stop (the stop can come first:
a start queued behind a slow prolog, or delayed on the bus) or that already ran here (a
new launcher owner resuming a start it cannot know finished); and srun's stops are kept
so that a step launched after its srun was interrupted starts nothing (steps_agent.py).
Kept in memory only, all three were lost when the agent was SIGKILLed and restarted in
between, and the generation or the step then ran anyway. So was how a step ended, when
the agent was killed between reading its tasks' exits and its answer reaching the
launcher: the launcher's `adopt` then found the step "lost".

Each entry is a file of its own under the agent's state folder (`kept/<kind>/`),
written before the agent answers the request that made it; a restarted agent reads the
folder back. `KeptKeys` holds at most `limit` generations (the oldest go first);
`KeptStops` holds srun's stops, and `KeptOutcomes` how steps ended, for `keep_s`. A
write that fails (a full or read-only disk) is logged and the entry is kept in memory:
the agent answers as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from pathlib import Path

import msgspec

from services.launcher.worker_table import read_struct, write_struct
from shared.api import StepOutcome
from shared.logs import kv

log = logging.getLogger(__name__)

Generation = tuple[int, int, int]  # job, attempt, generation


def _name(key: Generation) -> str:
    return "-".join(str(part) for part in key)


def _parse(name: str) -> Generation | None:
    parts = name.split("-")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


class KeptKeys:
    """A set of generations, in the order they were added, kept as empty files."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self._keys: dict[Generation, None] = {}
        found: list[tuple[int, str, Generation]] = []
        try:
            for entry in os.scandir(folder):
                key = _parse(entry.name)
                with contextlib.suppress(FileNotFoundError):
                    if key is not None:
                        found.append((entry.stat().st_mtime_ns, entry.name, key))
        except FileNotFoundError:
            pass  # nothing kept yet
        except OSError as err:
            log.warning("cannot read what was kept", extra=kv(folder=str(folder), error=str(err)))
        found.sort()  # the oldest first: those past the limit go
        cut = max(0, len(found) - limit)
        for _, name, _ in found[:cut]:
            _remove(folder / name)
        self._keys.update(dict.fromkeys(key for *_, key in found[cut:]))

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Generation) -> None:
        if key in self._keys:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / _name(key)).touch()
        except OSError as err:
            log.warning("cannot keep on disk", extra=kv(folder=str(self.folder), error=str(err)))
        self._keys[key] = None
        while len(self._keys) > self.limit:
            oldest = next(iter(self._keys))
            del self._keys[oldest]
            _remove(self.folder / _name(oldest))


class KeptStop(msgspec.Struct, frozen=True, kw_only=True):
    job_id: int
    output_dir: str  # srun's output folder: the step it stops
    at: float  # wall-clock time it came
    grace_s: float


class KeptStops:
    """srun's stops by (job, output folder), each kept for `keep_s`."""

    def __init__(self, folder: Path, keep_s: float) -> None:
        self.folder = folder
        self.keep_s = keep_s
        self._stops: dict[tuple[int, str], KeptStop] = {}
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(folder.glob("*.json")):
                stop = read_struct(path, KeptStop)
                if stop is None or now - stop.at > keep_s:
                    _remove(path)
                    continue
                self._stops[(stop.job_id, stop.output_dir)] = stop

    def add(self, job_id: int, output_dir: str, grace_s: float) -> None:
        now = time.time()
        for old in [k for k, s in self._stops.items() if now - s.at > self.keep_s]:
            _remove(self._path(self._stops.pop(old)))
        stop = KeptStop(job_id=job_id, output_dir=output_dir, at=now, grace_s=grace_s)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_struct(self._path(stop), stop)
        except OSError as err:
            log.warning("cannot keep on disk", extra=kv(folder=str(self.folder), error=str(err)))
        self._stops[(job_id, output_dir)] = stop

    def grace(self, job_id: int, output_dir: str) -> float | None:
        """The grace of a stop kept for the job's step writing under `output_dir`."""
        stop = self._stops.get((job_id, output_dir))
        return None if stop is None else stop.grace_s

    def _path(self, stop: KeptStop) -> Path:
        digest = hashlib.sha256(stop.output_dir.encode()).hexdigest()[:16]
        return self.folder / f"{stop.job_id}-{digest}.json"


StepKey = tuple[int, int, int, int]  # job, attempt, generation, step id


class KeptOutcome(msgspec.Struct, frozen=True, kw_only=True):
    key: StepKey
    at: float  # wall-clock time the step's tasks here had all ended
    outcome: StepOutcome


class KeptOutcomes:
    """How each step's tasks here ended, by step, each kept for `keep_s`: written before
    the tasks' folders go, so an agent killed before its answer reached the launcher
    leaves the next agent the answer to the launcher's `adopt`, not "lost"."""

    def __init__(self, folder: Path, keep_s: float) -> None:
        self.folder = folder
        self.keep_s = keep_s
        self._kept: dict[StepKey, KeptOutcome] = {}
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(folder.glob("*.json")):
                kept = read_struct(path, KeptOutcome)
                if kept is None or now - kept.at > keep_s:
                    _remove(path)
                    continue
                self._kept[kept.key] = kept

    def add(self, key: StepKey, outcome: StepOutcome) -> None:
        now = time.time()
        for old in [k for k, o in self._kept.items() if now - o.at > self.keep_s]:
            _remove(self._path(self._kept.pop(old).key))
        kept = KeptOutcome(key=key, at=now, outcome=outcome)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_struct(self._path(key), kept)
        except OSError as err:
            log.warning("cannot keep on disk", extra=kv(folder=str(self.folder), error=str(err)))
        self._kept[key] = kept

    def get(self, key: StepKey) -> StepOutcome | None:
        kept = self._kept.get(key)
        return None if kept is None else kept.outcome

    def _path(self, key: StepKey) -> Path:
        return self.folder / ("-".join(str(part) for part in key) + ".json")


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
