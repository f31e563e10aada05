"""Pure core: exact early answers for the jobs of a pass that plainly cannot start.

Most of a long queue waits: the cluster has no room for it now, and the pass has no
booking or preemption left to give it. For a *plain* job (no `--constraint`, node list,
reservation, exclusivity, no limits or windows in the snapshot, not `strict_order`) the
full path in place.py reaches "no room" from counts alone. `quick` answers from the same
counts, without walking nodes, the very Wait the full path would give, or None to say
"take the full path":

- the prechecks depend on a handful of the job's fields and on pool facts fixed for the
  prepared cluster: they are cached per key (`precheck_key`);
- a gang of nmin nodes of g GPUs has no room when the pool has fewer than nmin nodes
  with g free even counting every node a booking holds (the first test of
  `Prepared._try_start`, which returns "no room" then);
- a GPU total wider than a node has no room when the pool's free GPUs and every GPU a
  booking holds fall short of it (select_total would find too few);

and then, when the job may not preempt and no booking is left for it, the wait is
RESOURCES for the first blocked job of the pass, PRIORITY behind it for the rest, as
`Prepared._blocked` says. Anything else goes the full way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.placer.core.index import ROOT, Pool
from services.placer.core.job_pool import job_pool
from services.placer.core.model import JobRequest, Preempt, Wait, Waiting
from services.placer.core.select import NO_ROOM
from services.placer.core.shape import precheck, shape_of

if TYPE_CHECKING:
    from services.placer.core.place import Prepared

# (partition, GPU model, multi_node, nodes_min, nodes_max, gpus_per_node, gpus_total,
# a time limit of 1 s at least): all precheck reads of a plain job
PrecheckKey = tuple[str, str | None, bool, int, int, int, int | None, bool]
Prechecked = tuple[Pool, tuple[Waiting, str] | None]


def plain(job: JobRequest) -> bool:
    """A job the quick answers apply to (the snapshot and policy are checked apart)."""
    return not (
        job.held
        or job.blocked_by is not None
        or job.constraint
        or job.reservation is not None
        or job.exclusive
        or job.required_nodes
        or job.excluded_nodes
    )


def precheck_key(job: JobRequest) -> PrecheckKey:
    return (
        job.partition,
        job.gpu_model,
        job.multi_node,
        job.nodes_min,
        job.nodes_max,
        job.gpus_per_node,
        job.gpus_total,
        job.time_limit_s >= 1,
    )


def quick(prep: Prepared, job: JobRequest, preempts: list[Preempt]) -> Wait | None:
    """The Wait `Prepared._decide` gives a plain job, when counts alone decide it."""
    key = precheck_key(job)
    got = prep.prechecked.get(key)
    if got is None:  # the full prechecks, as _decide runs them (pools made in order)
        early = precheck(prep.ix, job)
        got = prep.prechecked[key] = (job_pool(prep.ix, job), early)
    pool, early = got
    if early is not None:
        return Wait(job_id=job.job_id, reason=early[0], detail=early[1])
    if prep.tested >= prep.config.max_job_test:
        return Wait(job_id=job.job_id, reason=Waiting.NOT_TESTED, detail=NOT_TESTED)
    if not _no_room(prep, job, pool):
        return None
    prep.tested += 1
    cfg = prep.config
    if (cfg.preemption and job.can_preempt and prep.preemptors < cfg.max_preemptors) or (
        cfg.backfill and len(prep.bookings) < cfg.reservation_depth
    ):
        return prep.blocked(job, pool, shape_of(job, prep.ix), NO_ROOM, preempts)
    if prep.blocked_by is None:
        prep.blocked_by = job.job_id
        return Wait(job_id=job.job_id, reason=Waiting.RESOURCES)
    return Wait(job_id=job.job_id, reason=Waiting.PRIORITY, detail=f"behind job {prep.blocked_by}")


NOT_TESTED = "beyond max_job_test this pass"


def _no_room(prep: Prepared, job: JobRequest, pool: Pool) -> bool:
    """Whether `_try_start` answers "no room" for this plain job, from counts alone."""
    ix = prep.ix
    total = job.gpus_total
    if total is not None and job.gpus_per_node == 0 and total > 0:
        if total > max(ix.width, 1):  # a GPU total over several nodes (shape_of)
            return sum(pool.ge[ROOT][1:]) + prep.held_gpus < total
        g, nmin = total, 1  # one node holds it: a plain single-node shape
    else:
        g, nmin = job.gpus_per_node, job.nodes_min
    free_nodes = pool.ge[ROOT][g] if g <= ix.width else 0
    return free_nodes + prep.held_nodes < nmin
