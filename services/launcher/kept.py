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
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

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


def _generations(folder: Path) -> list[tuple[int, str, Generation]]:
    """Each generation kept in `folder`: its file's time (ns), name and key."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []  # nothing kept yet
    except OSError as err:
        log.warning("cannot read what was kept", extra=kv(folder=str(folder), error=str(err)))
        return []
    found = []
    for entry in entries:
        key = _parse(entry.name)
        if key is not None:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                found.append((entry.stat().st_mtime_ns, entry.name, key))
    return found


class KeptKeys:
    """A set of generations, in the order they were added, kept as empty files."""

    def __init__(self, folder: Path, limit: int) -> None:
        self.folder = folder
        self.limit = limit
        self._keys: dict[Generation, None] = {}
        found = sorted(_generations(folder))  # the oldest first: those past the limit go
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


class _Dated(msgspec.Struct, frozen=True, kw_only=True):
    at: float  # wall-clock time it was kept


S = TypeVar("S", bound=_Dated)
K = TypeVar("K", bound=Hashable)


class _KeptFor(Generic[K, S]):
    """Entries of type `S` by key, each a JSON file (`name` of it) of its own, kept for
    `keep_s`: older ones are dropped as the folder is read back and as entries come."""

    def __init__(
        self,
        folder: Path,
        keep_s: float,
        kind: type[S],
        key: Callable[[S], K],
        name: Callable[[S], str],
    ) -> None:
        self.folder, self.keep_s, self._key, self._name = folder, keep_s, key, name
        self._kept: dict[K, S] = {}
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(folder.glob("*.json")):
                entry = read_struct(path, kind)
                if entry is None or now - entry.at > keep_s:
                    _remove(path)
                    continue
                self._kept[key(entry)] = entry

    def put(self, entry: S) -> None:
        for old in [k for k, e in self._kept.items() if entry.at - e.at > self.keep_s]:
            _remove(self.folder / self._name(self._kept.pop(old)))
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_struct(self.folder / self._name(entry), entry)
        except OSError as err:
            log.warning("cannot keep on disk", extra=kv(folder=str(self.folder), error=str(err)))
        self._kept[self._key(entry)] = entry

    def find(self, key: K) -> S | None:
        return self._kept.get(key)


class KeptStop(_Dated, frozen=True, kw_only=True):
    job_id: int
    output_dir: str  # srun's output folder: the step it stops
    grace_s: float


class KeptStops:
    """srun's stops by (job, output folder), each kept for `keep_s`."""

    def __init__(self, folder: Path, keep_s: float) -> None:
        self._kept = _KeptFor(folder, keep_s, KeptStop, _stop_key, _stop_name)

    def add(self, job_id: int, output_dir: str, grace_s: float) -> None:
        at = time.time()
        self._kept.put(KeptStop(job_id=job_id, output_dir=output_dir, at=at, grace_s=grace_s))

    def grace(self, job_id: int, output_dir: str) -> float | None:
        """The grace of a stop kept for the job's step writing under `output_dir`."""
        stop = self._kept.find((job_id, output_dir))
        return None if stop is None else stop.grace_s


def _stop_key(stop: KeptStop) -> tuple[int, str]:
    return stop.job_id, stop.output_dir


def _stop_name(stop: KeptStop) -> str:
    return f"{stop.job_id}-{hashlib.sha256(stop.output_dir.encode()).hexdigest()[:16]}.json"


StepKey = tuple[int, int, int, int]  # job, attempt, generation, step id


class KeptOutcome(_Dated, frozen=True, kw_only=True):
    key: StepKey
    outcome: StepOutcome


class KeptOutcomes:
    """How each step's tasks here ended, by step, each kept for `keep_s`: written before
    the tasks' folders go, so an agent killed before its answer reached the launcher
    leaves the next agent the answer to the launcher's `adopt`, not "lost"."""

    def __init__(self, folder: Path, keep_s: float) -> None:
        self._kept = _KeptFor(folder, keep_s, KeptOutcome, _outcome_key, _outcome_name)

    def add(self, key: StepKey, outcome: StepOutcome) -> None:
        self._kept.put(KeptOutcome(key=key, at=time.time(), outcome=outcome))

    def get(self, key: StepKey) -> StepOutcome | None:
        kept = self._kept.find(key)
        return None if kept is None else kept.outcome


def _outcome_key(kept: KeptOutcome) -> StepKey:
    return kept.key


def _outcome_name(kept: KeptOutcome) -> str:
    return "-".join(str(part) for part in kept.key) + ".json"


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
