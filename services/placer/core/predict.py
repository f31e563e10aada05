"""Pure core, runtime prediction: how long a job will really run, learned from finished ones.

Users' limits are poor estimates (most jobs use a fraction of theirs), and a scheduler
that plans on them leaves holes a short job could have filled and books starts far later
than they come. After Tsafrir, Etsion & Feitelson's EASY++ ("Backfilling using
system-generated predictions rather than user runtime estimates", IEEE TPDS 18(6),
2007): a job's predicted runtime is the mean runtime of the two most recent finished
jobs most like it -- the same user, job name and size; else the same user and size;
else the same user -- never more than its own limit, and none without such history.

Predictions only plan (backfill holes, bookings, estimated starts): the kill stays at
the user's limit. A running job that outlives its prediction has it extended (doubled
until it passes the time already run, capped at the limit), as EASY++ does.

Deterministic: the same outcomes learned in the same order give the same predictions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import msgspec

from services.placer.core.gc_pause import gc_paused
from services.placer.core.model import JobRequest, Running

RECENT = 2  # finished jobs averaged per key (EASY++ uses the last two)
FLOOR_S = 60  # no prediction below a minute: start-up alone takes that long


class Outcome(NamedTuple):
    """One finished job, as the predictor learns it."""

    user: str
    name: str
    gpus: int
    limit_s: int
    runtime_s: float


class Prediction(NamedTuple):
    seconds: int
    why: str  # for `muster show job`: which history the figure comes from


Key = tuple[str | int, ...]


def keys_of(user: str, name: str, gpus: int) -> tuple[Key, ...]:
    """Most specific first; a key without a job name is skipped when the name is empty."""
    keys: list[Key] = []
    if name:
        keys.append(("name", user, name, gpus))
    keys.append(("size", user, gpus))
    keys.append(("user", user))
    return tuple(keys)


class Predictor:
    """Recent runtimes per key; `learn` each finished job, `predict` a pending one.

    With a `window`, only the last `window` outcomes learned count: it predicts exactly
    what a predictor that learned just those would, learned one at a time (the placer
    adds each finished job instead of reloading its whole history after every end).
    An outcome learned under an `ident` already in the window is not learned twice."""

    def __init__(self, recent: int = RECENT, window: int | None = None) -> None:
        self.recent = recent
        self.window = window
        self._runtimes: dict[Key, deque[float]] = {}
        # each key's prediction before the limit (its `recent` runtimes' mean, rounded, at
        # least FLOOR_S), kept as they are learned and forgotten: a service cycle asks
        # for every waiting job (50,000 in bench/placer_scale.py), so an answer is a few
        # dict reads
        self._means: dict[Key, int] = {}
        self._counts: dict[Key, int] = {}  # window: outcomes in it under each key
        self._order: deque[tuple[tuple[Key, ...], object]] = deque()  # window, oldest first
        self._idents: set[object] = set()

    def learn(self, outcome: Outcome, ident: object = None) -> bool:
        """Learn one finished job; False when `ident` is in the window already."""
        if ident is not None:
            if ident in self._idents:
                return False
            self._idents.add(ident)
        keys = keys_of(outcome.user, outcome.name, outcome.gpus)
        for key in keys:
            seen = self._runtimes.get(key)
            if seen is None:
                seen = self._runtimes[key] = deque(maxlen=self.recent)
            seen.append(outcome.runtime_s)
            self._remean(key, seen)
        if self.window is not None:
            for key in keys:
                self._counts[key] = self._counts.get(key, 0) + 1
            self._order.append((keys, ident))
            while len(self._order) > self.window:
                self._forget_oldest()
        return True

    def _forget_oldest(self) -> None:
        """The oldest outcome leaves the window. Under each of its keys it is the oldest
        of the window's outcomes, so it is still held only if at most `recent` came
        under that key since (it is then the first held): drop it there."""
        keys, ident = self._order.popleft()
        self._idents.discard(ident)
        for key in keys:
            left = self._counts[key] - 1
            seen = self._runtimes[key]
            if len(seen) > left:
                seen.popleft()
                self._remean(key, seen)
            if left:
                self._counts[key] = left
            else:
                del self._counts[key], self._runtimes[key]
                self._means.pop(key, None)

    def _remean(self, key: Key, seen: deque[float]) -> None:
        if len(seen) >= self.recent:
            self._means[key] = max(FLOOR_S, round(sum(seen) / len(seen)))
        else:
            self._means.pop(key, None)

    def _found(self, user: str, name: str, gpus: int) -> tuple[int, Key] | None:
        """The mean of the most specific key with history enough, and that key."""
        means = self._means
        if name:
            key: Key = ("name", user, name, gpus)
            mean = means.get(key)
            if mean is not None:
                return mean, key
        key = ("size", user, gpus)
        mean = means.get(key)
        if mean is not None:
            return mean, key
        key = ("user", user)
        mean = means.get(key)
        return None if mean is None else (mean, key)

    def seconds(self, user: str, name: str, gpus: int, limit_s: int) -> int | None:
        """`predict`'s seconds alone (the queue's every job, every cycle)."""
        found = self._found(user, name, gpus)
        return None if found is None else min(limit_s, found[0])

    def predict(self, user: str, name: str, gpus: int, limit_s: int) -> Prediction | None:
        found = self._found(user, name, gpus)
        if found is None:
            return None
        mean, key = found
        said = f"mean of the last {len(self._runtimes[key])} {_said(key)}"
        return Prediction(min(limit_s, mean), said)

    def for_job(self, job: JobRequest) -> Prediction | None:
        return self.predict(job.user, job.name, _gpus(job), job.time_limit_s)

    def for_running(self, run: Running) -> Prediction | None:
        return self.predict(run.user, run.name, _held(run), run.time_limit_s)


def learned(outcomes: Iterable[Outcome]) -> Predictor:
    """A predictor that has learned `outcomes`, in order."""
    p = Predictor()
    for o in outcomes:
        p.learn(o)
    return p


def with_predictions(
    predictor: Predictor, pending: Sequence[JobRequest], running: Sequence[Running]
) -> tuple[list[JobRequest], tuple[Running, ...]]:
    """The queue and the running jobs, each with its predicted runtime (if any). A
    service cycle's every waiting job is copied: the collector is paused meanwhile, as in
    a pass (gc_pause.py), since the copies make no cycles and would set off collections
    that walk all the caller holds."""
    replace, means = msgspec.structs.replace, predictor._means
    jobs = []
    runs = []
    with gc_paused():
        for j in pending:  # `seconds`, inlined: 50,000 calls a cycle in the benchmark
            user, name, total = j.user, j.name, j.gpus_total
            gpus = j.nodes_min * j.gpus_per_node if total is None else total
            got = means.get(("name", user, name, gpus)) if name else None
            if got is None:
                got = means.get(("size", user, gpus))
                if got is None:
                    got = means.get(("user", user))
                    if got is None:
                        jobs.append(j)
                        continue
            limit = j.time_limit_s
            jobs.append(replace(j, predicted_s=got if got < limit else limit))
        for r in running:
            got = predictor.seconds(r.user, r.name, _held(r), r.time_limit_s)
            runs.append(r if got is None else replace(r, predicted_s=got))
    return jobs, tuple(runs)


def _said(key: Key) -> str:
    kind = key[0]
    if kind == "name":
        return f"jobs of {key[1]} named {key[2]} on {key[3]} GPUs"
    if kind == "size":
        return f"jobs of {key[1]} on {key[2]} GPUs"
    return f"jobs of {key[1]}"


def _held(run: Running) -> int:
    return sum(len(g.gpus) for g in run.grants)


def _gpus(job: JobRequest) -> int:
    if job.gpus_total is not None:
        return job.gpus_total
    return job.nodes_min * job.gpus_per_node


def planned_runtime(job: JobRequest, use: bool = True) -> int:
    """What placement plans on for a pending job: its prediction, else its limit."""
    if job.predicted_s is None or not use:
        return job.time_limit_s
    return max(1, min(job.predicted_s, job.time_limit_s))


def explained_end(predictor: Predictor, run: Running, now: float) -> tuple[float, str] | None:
    """When `run` is expected to end, and why (for `muster show job`); None without a
    prediction (it is planned on its limit)."""
    got = predictor.for_running(run)
    if got is None:
        return None
    end = planned_end(msgspec.structs.replace(run, predicted_s=got.seconds), now)
    why = got.why
    if end >= run.started_at + run.time_limit_s:
        why = f"{why}; at its limit"
    elif end > run.started_at + got.seconds:
        why = f"{why}; extended, it outlived {got.seconds} s"
    return round(end, 3), why


def planned_end(run: Running, now: float, use: bool = True) -> float:
    """When a running job is expected to end: its prediction, extended once outlived
    (doubled until it passes `now`), never past its limit; without one, its limit."""
    limit_end = run.started_at + run.time_limit_s
    if run.predicted_s is None or run.predicted_s >= run.time_limit_s or not use:
        return max(now, limit_end)
    span = max(run.predicted_s, 1)
    while run.started_at + span <= now and span < run.time_limit_s:
        span *= 2
    return max(now, min(limit_end, run.started_at + span))
