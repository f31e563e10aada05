"""Pure core: exact early answers for the jobs of a pass that plainly cannot start.

Most of a long queue waits: the cluster has no room for it now, and the pass has no
booking or preemption left to give it. For a *plain* job (no `--constraint`, node list,
reservation, exclusivity, node too small for it; no limits or windows in the snapshot,
not `strict_order`) the full path in place.py reaches "no room" from counts alone.
`Quick` answers from the same counts, without walking nodes, the very Wait the full path
would give, or None to say "take the full path":

- the prechecks read a handful of the job's fields (`Key`) and pool facts fixed for the
  prepared cluster: they are cached per key, with the pool and the shape's counts;
- a gang of nmin nodes of g GPUs has no room when the pool has fewer than nmin nodes
  with g free even counting every node a booking holds (the first test of
  `Prepared._try_start`, which returns "no room" then); memory held on nodes
  (memory.py) only takes nodes away, so a job asking some is answered alike;
- a GPU total wider than a node has no room when the pool's free GPUs and every GPU a
  booking holds fall short of it (select_total, even with every booking's GPUs lent,
  would find too few; lending and taking back leaves the index as it was);

and then, when the job may not preempt and no booking is left for it, the wait is
RESOURCES for the first blocked job of the pass, PRIORITY behind it for the rest, as
`Prepared.blocked` says; otherwise `Prepared.blocked` itself answers. The full path
changes nothing on its way to "no room", so neither does this one. Anything else goes
the full way.
"""

from __future__ import annotations

from typing import Protocol

from services.placer.core.index import ClusterIndex
from services.placer.core.job_pool import job_pool
from services.placer.core.model import JobRequest, PolicyConfig, Preempt, Wait, Waiting
from services.placer.core.pools import ROOT, Pool
from services.placer.core.select import NO_ROOM
from services.placer.core.shape import Shape, precheck, shape_of
from services.placer.core.sizes import too_small
from services.placer.core.timeline import Booking


class Prepared(Protocol):
    """What quick answers read and move of a prepared cluster (place.Prepared, which
    imports this module: a protocol, not an import back, keeps the graph acyclic)."""

    ix: ClusterIndex
    config: PolicyConfig
    tested: int
    held_gpus: int
    held_nodes: int
    preemptors: int
    bookings: list[Booking]
    blocked_by: int | None

    def blocked(
        self, job: JobRequest, pool: Pool, shape: Shape, why: str, preempts: list[Preempt]
    ) -> Wait: ...

    def short_words(self, job: JobRequest, pool: Pool) -> str: ...


NOT_TESTED = "beyond max_job_test this pass"
# the members, looked up once (an enum member read through its class costs a lookup)
_NOT_TESTED, _PRIORITY, _RESOURCES = Waiting.NOT_TESTED, Waiting.PRIORITY, Waiting.RESOURCES

# (partition, GPU model, multi_node, nodes_min, nodes_max, gpus_per_node, gpus_total,
# a time limit of 1 s at least): all that precheck and shape_of read of a plain job
Key = tuple[str, str | None, bool, int, int, int, int | None, bool]


# (the precheck's answer, the pool, its count row: pool nodes with >= k GPUs free, kept
# up to date by the index; a GPU total over several nodes or 0, then the shape's g and
# nmin, g -1 when no node has that many)
Entry = tuple[tuple[Waiting, str] | None, Pool, list[int], int, int, int]


def entry(prep: Prepared, job: JobRequest) -> Entry:
    """What one key fixes, from the full prechecks as _decide runs them."""
    ix = prep.ix
    early = precheck(ix, job)
    pool = job_pool(ix, job)
    total = job.gpus_total
    if total is not None and job.gpus_per_node == 0 and total > 0:
        if total > max(ix.width, 1):  # shape_of spreads it over nodes
            return early, pool, pool.ge[ROOT], total, 1, 1
        g, nmin = total, 1  # one node holds it: a plain single-node shape
    else:
        g, nmin = job.gpus_per_node, job.nodes_min
    return early, pool, pool.ge[ROOT], 0, g if g <= ix.width else -1, nmin


class Quick:
    """The quick answers of one prepared cluster (see the module doc)."""

    __slots__ = ("behind", "book", "depth", "entries", "max_test", "most", "preempt", "prep")

    def __init__(self, prep: Prepared) -> None:
        self.prep = prep
        cfg = prep.config
        self.max_test = cfg.max_job_test
        self.preempt, self.most = cfg.preemption, cfg.max_preemptors
        self.book, self.depth = cfg.backfill, cfg.reservation_depth
        self.entries: dict[Key, Entry] = {}
        self.behind: tuple[int | None, str] = (None, "")  # the first blocked job, its words

    def __call__(self, job: JobRequest, preempts: list[Preempt]) -> Wait | None:
        """The Wait `Prepared._decide` gives this job when counts alone decide it, else
        None (also for a job that is not plain)."""
        if (
            job.held
            or job.blocked_by is not None
            or job.constraint
            or job.reservation is not None
            or job.exclusive
            or job.required_nodes
            or job.excluded_nodes
            or too_small(self.prep.ix, job)
        ):
            return None
        key = (
            job.partition,
            job.gpu_model,
            job.multi_node,
            job.nodes_min,
            job.nodes_max,
            job.gpus_per_node,
            job.gpus_total,
            job.time_limit_s >= 1,
        )
        prep = self.prep
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = entry(prep, job)
        early, pool, row, total, g, nmin = e
        if early is not None:
            return Wait(job_id=job.job_id, reason=early[0], detail=early[1])
        if prep.tested >= self.max_test:
            return Wait(job_id=job.job_id, reason=_NOT_TESTED, detail=NOT_TESTED)
        if total:  # select_total finds too few GPUs even with every booking's lent
            if sum(row) - row[0] + prep.held_gpus >= total:
                return None
        elif (row[g] if g >= 0 else 0) + prep.held_nodes >= nmin:
            return None  # _try_start's first test passes: there may be room
        prep.tested += 1
        if (job.can_preempt and self.preempt and prep.preemptors < self.most) or (
            self.book and len(prep.bookings) < self.depth
        ):
            return prep.blocked(job, pool, shape_of(job, prep.ix), NO_ROOM, preempts)
        if prep.blocked_by is None:
            prep.blocked_by = job.job_id
            return Wait(job_id=job.job_id, reason=_RESOURCES, detail=prep.short_words(job, pool))
        if self.behind[0] != prep.blocked_by:
            self.behind = (prep.blocked_by, f"behind job {prep.blocked_by}")
        return Wait(job_id=job.job_id, reason=_PRIORITY, detail=self.behind[1])
