"""Pure core: the running jobs' releases, what the future (timeline.py) starts from.

Each running job gives back its GPUs at its planned end (predict.py), a preempted one
by its grace. A planned end after `now` stays the same for every later `now` before it,
so the releases a pass made are kept with the marking (marked.py) and reused by the
passes that follow, until the job ends or its end passes.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.placer.core.marked import Marked
from services.placer.core.model import Running
from services.placer.core.predict import planned_end
from services.placer.core.timeline import Release


def running_releases(
    running: Sequence[Running],
    picks: Sequence[Sequence[tuple[int, int]]],
    now: float,
    use: bool,
    marked: Marked,
) -> list[Release]:
    """Every running job's GPUs at its planned end (a preempted one's: by its grace).

    `marked.ends` keeps a job's releases by the job's identity, for the jobs `marked`
    holds (alive: an id there is that job's), while they hold: a planned end e after
    `now` stays e for every later `now` before e (the prediction's doubling stops at the
    same span), so releases made at `from` serve any now in [from, e) with the same
    `use`."""
    ends, alive = marked.ends, marked.by_id
    out: list[Release] = []
    kepts = list(map(ends.get, map(id, running)))
    for r, got, kept in zip(running, picks, kepts, strict=True):
        if kept is not None and kept[0] <= now < kept[1] and kept[2] == use:
            out += kept[3]
            continue
        key = id(r)
        end = planned_end(r, now, use)
        job_id = r.job_id
        if r.preempted_by is not None:
            end = min(end, now + r.grace_s)
            out += [Release(end, i, m, job_id) for i, m in got if m]
            continue
        made = [Release(end, i, m, job_id) for i, m in got if m]
        if end > now and key in alive:
            ends[key] = (now, end, use, made)
        out += made
    return out
