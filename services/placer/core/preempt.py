"""Pure core, preemption: which running jobs to stop so a higher tier can start.

Candidates are whole running jobs of a strictly lower tier, preemptible, past their
minimum runtime and not already promised to another preemptor. Taken in order of least
lost work (lowest priority, then least progress since start, then fewest GPUs), they are
freed one by one until the preemptor fits; it is then placed preferring GPUs already
free, and only the jobs whose GPUs it actually uses become victims. A strictly lower
tier can never preempt back, so there are no preemption cycles.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from services.placer.core.counted import Counts, earliest_counted, select_counted
from services.placer.core.index import ClusterIndex, Pool
from services.placer.core.model import JobRequest, Running
from services.placer.core.select import IndexView, pick_gpus
from services.placer.core.shape import Shape
from services.placer.core.timeline import Future, Need, Release, whole_nodes


def candidates(
    running: Sequence[Running], taken: Collection[int], job: JobRequest, now: float
) -> list[Running]:
    """Running jobs `job` may preempt, cheapest first; `taken` are already promised to
    an earlier preemptor of this pass."""
    found = [
        r
        for r in running
        if r.tier < job.tier
        and r.preemptible
        and r.job_id not in taken
        and now - r.started_at >= r.min_runtime_s
        and r.preempted_by in (None, job.job_id)
    ]
    found.sort(
        key=lambda r: (
            r.preempted_by != job.job_id,  # already leaving for this job: free of cost
            r.priority,
            now - r.started_at,
            sum(len(g.gpus) for g in r.grants),
            r.job_id,
        )
    )
    return found


def choose_victims(
    ix: ClusterIndex,
    future: Future,
    cands: list[Running],
    job: JobRequest,
    *,
    pool: Pool,
    shape: Shape,
    ok: Callable[[int], bool],
    now: float,
    runtime: int,
    counts: Counts = (),
) -> tuple[list[tuple[int, int]], list[Running]] | None:
    """The preemptor's GPUs (node id, mask) and the victims (among `cands`, cheapest
    first) that free them, or None. `ok` filters the nodes it may use; `runtime` is
    what the preemptor is planned to run (promises overlapping it are off limits);
    `counts`, the feature counts its nodes must meet (counted.py)."""
    if not cands:
        return None
    releases = [
        Release(float(rank), ix.id_of[g.node], ix.mask_of(ix.id_of[g.node], g.gpus), r.job_id)
        for rank, r in enumerate(cands)
        for g in r.grants
        if g.node in ix.id_of
    ]
    need = Need(shape.g, shape.nmin, runtime, now, ranked=True, whole=job.exclusive)
    found = earliest_counted(ix, future, IndexView(ix, pool), releases, need, ok, counts)
    if found is None:
        return None
    view = found[1]
    chosen = select_counted(ix, view, counts, shape.nmin, shape.nmin, shape.g, None)
    if isinstance(chosen, str):
        return None
    if job.exclusive:  # every job on its nodes goes, as for an explicit whole-node request
        picks = list(whole_nodes(ix, chosen.picks))
    else:
        picks = [
            (i, _prefer_free(ix, i, view.usable(i), releases, shape.g)) for i, _ in chosen.picks
        ]
    taken = dict(picks)
    hit = {rel.job_id for rel in releases if rel.mask & taken.get(rel.node, 0)}
    return picks, [r for r in cands if r.job_id in hit]


def _prefer_free(ix: ClusterIndex, i: int, usable: int, releases: list[Release], g: int) -> int:
    """g GPUs on node i: free ones first, then the cheapest victims' (releases are ranked)."""
    free_part = ix.free[i] & usable
    if free_part.bit_count() >= g:
        return pick_gpus(ix, i, free_part, g)
    mask = free_part
    for rel in releases:
        if rel.node != i:
            continue
        extra = rel.mask & usable & ~mask
        while extra and mask.bit_count() < g:
            low = extra & -extra
            mask |= low
            extra ^= low
        if mask.bit_count() >= g:
            break
    return mask
