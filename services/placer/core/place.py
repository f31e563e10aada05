"""Pure core: place(snapshot, pending, now) -> Plan, and the Prepared cluster behind it.

One pass walks pending jobs in order (order.py: tier, then priority less a predicted-
service term plus a linear age term, with a hard age bound; then submit time, id). Each
job either
starts now (topology-aware gang placement, see select.py), preempts lower tiers, or
waits with a reason; the first `reservation_depth` blocked jobs get a booked start
(timeline.py) that later jobs may not delay: that is backfill. No I/O, no clock, no
randomness: the same input always gives the same plan.

`prepare(snapshot, now)` builds the index once; `Prepared.plan(pending)` is a full pass
and `Prepared.place_one(job)` places one more job against what the index holds then
(the incremental path for a job submitted between passes: O(switches), not O(nodes)).
Most of a long queue just waits: quick.py answers those plain jobs from pool counts,
exactly as the full path would, and a pass runs with the garbage collector paused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from services.placer.core.calendar import Window, inside, off_limits, windows
from services.placer.core.counted import earliest_counted, select_counted, select_total_counted
from services.placer.core.gc_pause import gc_paused
from services.placer.core.index import ClusterIndex
from services.placer.core.job_pool import Choice, counts_in, job_choices, job_pool
from services.placer.core.limits import Usage, check, headroom
from services.placer.core.memory import WHOLE, HeldMemory, asks
from services.placer.core.model import (
    Backfill,
    Grant,
    JobRequest,
    Limits,
    Plan,
    PolicyConfig,
    Preempt,
    Running,
    Snapshot,
    Start,
    Wait,
    Waiting,
)
from services.placer.core.order import ranked
from services.placer.core.pools import ROOT, Pool
from services.placer.core.predict import planned_runtime
from services.placer.core.preempt import Victims, choose_victims
from services.placer.core.quick import Quick
from services.placer.core.releases import running_releases
from services.placer.core.select import (
    NO_ROOM,
    NO_TOPOLOGY,
    CandidateView,
    Chosen,
    IndexView,
)
from services.placer.core.shape import Shape, counted_shape, precheck, shape_of, within_limits
from services.placer.core.sizes import too_small
from services.placer.core.timeline import (
    Booking,
    Future,
    Need,
    NodeOk,
    earliest,
    earliest_leaf,
    whole_nodes,
)

DEFAULT_POLICY = PolicyConfig()
LEAF_SOON = "a leaf switch frees soon"
NO_LIMITS = Limits()


def order_key(job: JobRequest) -> tuple[int, float, bool, float, int]:
    """Tier first, then priority (both high first), then requeued jobs (a fault or a
    preemption put them back: they go to the head of their priority), then submit time,
    then id."""
    return (-job.tier, -job.priority, not job.requeued, job.submitted_at, job.job_id)


def place(
    snapshot: Snapshot,
    pending: Sequence[JobRequest],
    now: float,
    config: PolicyConfig = DEFAULT_POLICY,
) -> Plan:
    """Decide, for every pending job, start now, preempt for it, or wait (and why)."""
    with gc_paused():
        prep = prepare(snapshot, now, config)
        try:
            return prep.plan(pending)
        finally:
            prep.quick = None  # the one reference cycle: the pass's objects go at once


def prepare(snapshot: Snapshot, now: float, config: PolicyConfig = DEFAULT_POLICY) -> Prepared:
    return Prepared(snapshot, now, config)


class Prepared:
    """One snapshot indexed for placement at `now`. Not thread-safe; cheap to drop."""

    def __init__(self, snapshot: Snapshot, now: float, config: PolicyConfig) -> None:
        self.snapshot = snapshot
        self.now = now
        self.config = config
        self.ix = ix = ClusterIndex(snapshot)
        self.limited = snapshot.limits != NO_LIMITS
        self.usage = Usage.of(snapshot.running) if self.limited else Usage()
        self.runs = Victims(ix, snapshot.running, now)  # a node gone holds nothing
        self.memory = HeldMemory(ix, snapshot.running)  # --mem counted out per node
        self.future = Future(
            ix,
            partial(
                running_releases,
                snapshot.running,
                self.runs.picks,
                now,
                config.use_predictions,
                ix.marked,
            ),
        )
        self.windows: list[Window] = windows(ix, snapshot.reservations, now)
        self.bookings: list[Booking] = []
        self.held_nodes = 0  # nodes holding GPUs for bookings, counted once per booking
        self.held_gpus = 0  # and the GPUs they hold
        self.victims: set[int] = set()
        self.blocked_by: int | None = None  # first job left waiting for resources
        self.tested = 0
        # what took GPUs or memory so far (a start, a booking, a preemptor's hold), and
        # the memory-bound shapes found without room since the last of them (`_memo`)
        self.moves = 0
        self.no_room: dict[tuple[object, ...], int] = {}
        self.preemptors = 0
        self.leaf_at: tuple[float, int] | None = None  # set by _leaf_soon
        # quick.py: exact early answers for plain jobs (none with limits or windows)
        plain = not self.limited and not self.windows and not config.strict_order
        self.quick = Quick(self) if plain else None

    def plan(self, pending: Sequence[JobRequest]) -> Plan:
        starts: list[Start] = []
        preempts: list[Preempt] = []
        waits: list[Wait] = []
        quick, decide = self.quick, self._decide
        with gc_paused():
            for job in ranked(pending, self.now, self.config):
                early = None if quick is None else quick(job, preempts)
                out = decide(job, preempts) if early is None else early
                if isinstance(out, Wait):
                    waits.append(out)
                else:
                    starts.append(out)
        return Plan(starts=tuple(starts), preemptions=tuple(preempts), waits=tuple(waits))

    def place_one(self, job: JobRequest) -> Plan:
        """One more job against the state left by earlier calls (starts, bookings)."""
        preempts: list[Preempt] = []
        early = None if self.quick is None else self.quick(job, preempts)
        out = self._decide(job, preempts) if early is None else early
        if isinstance(out, Start):
            return Plan(starts=(out,), preemptions=tuple(preempts))
        return Plan(waits=(out,), preemptions=tuple(preempts))

    # --- one job ----------------------------------------------------------------------

    def _decide(self, job: JobRequest, preempts: list[Preempt]) -> Start | Wait:
        early = precheck(self.ix, job)
        if early is not None:
            return Wait(job_id=job.job_id, reason=early[0], detail=early[1])
        if self.config.strict_order and self.blocked_by is not None:
            return self._wait(job, Waiting.PRIORITY, f"in order behind job {self.blocked_by}")
        shape = shape_of(job, self.ix)
        if self.limited:
            over = check(self.snapshot.limits, self.usage, job, shape.gpus)
            if over is not None:
                return self._wait(job, over[0], over[1])
            shape = within_limits(shape, headroom(self.snapshot.limits, self.usage, job))
        if self.tested >= self.config.max_job_test:
            return self._wait(job, Waiting.NOT_TESTED, "beyond max_job_test this pass")
        self.tested += 1
        first: Start | Wait | str | None = None
        for choice in job_choices(self.ix, job):  # one per [..] alternative, else one
            got = self._try_start(job, choice.pool, counted_shape(shape, job, self.ix, choice))
            if isinstance(got, Start):
                return got
            first = got if first is None else first
        if isinstance(first, Wait):
            return first
        pool = job_pool(self.ix, job)
        shape = counted_shape(shape, job, self.ix, Choice(pool, counts_in(self.ix, job, pool)))
        return self.blocked(job, pool, shape, str(first), preempts)

    def _runtime(self, job: JobRequest) -> int:
        return planned_runtime(job, self.config.use_predictions)

    def _wait(
        self, job: JobRequest, reason: Waiting, detail: str = "", at: float | None = None
    ) -> Wait:
        return Wait(job_id=job.job_id, reason=reason, detail=detail, estimated_start=at)

    def _try_start(self, job: JobRequest, pool: Pool, shape: Shape) -> Start | Wait | str:
        """A Start, a Wait for a reason other than room, or why there is no room."""
        now = self.now
        avoid, window = off_limits(self.windows, job, now)
        only = None
        if job.reservation is not None:
            mine = inside(self.windows, job)
            if mine is None:
                return self._wait(job, Waiting.BAD_CONSTRAINTS, f"no {job.reservation}")
            if mine.start > now:
                return self._wait(job, Waiting.RESERVATION, "not open yet", mine.start)
            only = mine.nodes
        end = now + self._runtime(job)
        plain = (
            not avoid
            and only is None
            and shape.total is None
            and not _filters(job)
            and not too_small(self.ix, job)
        )  # memory held (memory.py) only takes nodes away: "no room" holds all the same
        free_nodes = pool.ge[ROOT][shape.g] if shape.g <= self.ix.width else 0
        if plain and free_nodes + self.held_nodes < shape.nmin:
            return "no room"  # even borrowing every booking's GPUs would not do
        lent = [b for b in self.bookings if b.at >= end]
        if plain and free_nodes + sum(len(b.held) for b in lent) < shape.nmin:
            return "no room"
        memo = self._memo(job, pool, shape, lent) if plain else None
        if memo is not None and self.no_room.get(memo) == self.moves:
            return NO_ROOM  # as the last job of this shape found, nothing taken since
        for b in lent:
            for i, m in b.held:
                self.ix.give(i, m)
        g = shape.g if shape.total is None else 1  # GPUs it takes of a node, at least
        chosen = self._select(job, pool, shape, self._ok(job, avoid, only, memory_g=g))
        if isinstance(chosen, Chosen) and self._leaf_soon(job, pool, shape, chosen):
            chosen = LEAF_SOON
        start = self._commit(job, shape, chosen, lent) if isinstance(chosen, Chosen) else None
        self._rehold(lent)
        if memo is not None and chosen == NO_ROOM:
            self.no_room[memo] = self.moves
        if start is not None:
            return start
        if avoid and window is not None:
            dry = self._select(job, pool, shape, self._ok(job, frozenset(), only, memory_g=g))
            if isinstance(dry, Chosen):
                detail = f"would run into {window.name} at {window.start:.0f}"
                return self._wait(job, Waiting.RESERVATION, detail, window.end)
        return chosen if isinstance(chosen, str) else "no room"

    def _memo(
        self, job: JobRequest, pool: Pool, shape: Shape, lent: list[Booking]
    ) -> tuple[object, ...] | None:
        """What decides a plain job's search when memory binds it (memory.py): the
        search goes node by node then, and a queue holds many jobs alike. Every job of
        the same shape, memory, switch limit and lent bookings finds what the last one
        found while nothing has been taken since (`moves`). None: memory does not bind."""
        ask = asks(job)
        if not ask or not self.memory.binds(ask, shape.g):
            return None
        lent_ids = tuple(b.job_id for b in lent)
        return (pool.key, job.constraint, shape.g, shape.nmin, shape.nmax, ask,
                self._max_leaves(job), lent_ids)  # fmt: skip

    def _ok(
        self,
        job: JobRequest,
        avoid: frozenset[int],
        only: frozenset[int] | None,
        whole_now: bool = True,
        memory_g: int | None = None,
    ) -> Callable[[int], bool] | None:
        """The node filter of a job; `whole_now`: an exclusive job wants nodes idle now
        (off for bookings and preemption, which ask whether a node is whole *then*);
        `memory_g`: its --mem must fit beside what jobs hold now, taking that many GPUs
        of each node at least (None: not counted, as for bookings)."""
        ix = self.ix
        small = too_small(ix, job)  # nodes without its CPUs or memory per node
        ask = asks(job)
        # nodes whose memory running jobs hold, asked of each node as it is tried
        binds = memory_g is not None and self.memory.binds(ask, memory_g)
        lacks = self.memory.lacks if binds else None
        if not (avoid or small or binds or _filters(job, whole_now)) and only is None:
            return None
        out = set(avoid) | small | {ix.id_of[n] for n in job.excluded_nodes if n in ix.id_of}
        if job.required_nodes:
            req = frozenset(ix.id_of[n] for n in job.required_nodes if n in ix.id_of)
            only = req if only is None else only & req
        whole = job.exclusive and whole_now
        free, healthy, jobs_on = ix.free, ix.healthy, ix.jobs_on

        def ok(i: int) -> bool:
            if i in out or (only is not None and i not in only):
                return False
            if lacks is not None and lacks(i, ask):
                return False
            return not whole or (jobs_on[i] == 0 and free[i] == healthy[i])

        return ok

    def _select(
        self, job: JobRequest, pool: Pool, shape: Shape, ok: Callable[[int], bool] | None
    ) -> Chosen | str:
        ix = self.ix
        view: IndexView | CandidateView = IndexView(ix, pool)
        g = shape.g if shape.total is None else 1
        if ok is not None:
            view = CandidateView(ix, {i: ix.free[i] for i in view.candidates(g) if ok(i)}, g)
        counts = counts_in(self.ix, job, pool)
        if shape.total is not None:
            return select_total_counted(ix, view, shape.total, shape.nmax, counts)
        nmin = shape.nmin
        if job.required_nodes:
            nmin = max(nmin, min(len(job.required_nodes), shape.nmax))
        pack = self.config.pack_small
        leaves = self._max_leaves(job)
        return select_counted(ix, view, counts, nmin, shape.nmax, shape.g, leaves, pack)

    def _max_leaves(self, job: JobRequest) -> int | None:
        if job.max_switches is None:
            return None
        wait = job.switches_wait_s or self.config.max_switch_wait_s
        return None if self.now >= job.submitted_at + wait else job.max_switches

    def _leaf_soon(self, job: JobRequest, pool: Pool, shape: Shape, chosen: Chosen) -> bool:
        """`gang_leaf_wait_s`: a gang about to spread over leaves, that one leaf could
        hold, waits instead if a leaf holds it within that long (`self.leaf_at`)."""
        if len({self.ix.leaf_of[i] for i, _ in chosen.picks}) < 2:
            return False
        self.leaf_at = got = self._leaf_by(job, pool, shape, self.now)
        return got is not None and got[0] > self.now  # one holding it now: no wait

    def _leaf_by(
        self, job: JobRequest, pool: Pool, shape: Shape, at: float
    ) -> tuple[float, int] | None:
        """When and which one leaf holds the gang by `at` + `gang_leaf_wait_s`, for a
        gang the leaf wait applies to (rigid, 2 nodes up to a leaf's, no switch limit)."""
        wait = self.config.gang_leaf_wait_s
        ix = self.ix
        if wait <= 0 or job.max_switches is not None or shape.total is not None:
            return None
        if counts_in(ix, job, pool):  # one leaf's nodes may not meet the feature counts
            return None
        if not 2 <= shape.nmin <= ix.widest_leaf or job.required_nodes:
            return None
        if shape.nmax != shape.nmin:  # an elastic gang spreads to grow, by choice
            return None
        need = Need(shape.g, shape.nmin, self._runtime(job), self.now, whole=job.exclusive)
        ok = self._need_ok(job, pool)
        releases = self.future.releases()
        return earliest_leaf(ix, self.future, IndexView(ix, pool), releases, need, ok, at + wait)

    def _commit(self, job: JobRequest, shape: Shape, chosen: Chosen, lent: list[Booking]) -> Start:
        ix = self.ix
        grants = []
        picks = []
        for i, m in chosen.picks:
            mask = ix.free[i] if job.exclusive else m
            ix.take(i, mask)
            ix.jobs_on[i] += 1
            if job.exclusive:
                ix.hold_node(i)
            picks.append((i, mask))
            grants.append(Grant(node=ix.nodes[i].name, gpus=ix.gpus_of(i, mask)))
        self.future.add(self.now + self._runtime(job), picks, job.job_id)
        self.moves += 1
        if ask := asks(job):
            self.memory.start(ask, picks)
        gpus = sum(m.bit_count() for _, m in picks)
        if self.limited:
            self.usage.add(job.user, job.account, job.qos, gpus)
        taken = dict(picks)
        used = [b.job_id for b in lent if any(m & taken.get(i, 0) for i, m in b.held)]
        backfill, around = Backfill.NO, self.blocked_by
        if used:
            backfill, around = Backfill.BEFORE_RESERVED_START, used[0]
        elif self.blocked_by is not None:
            backfill = Backfill.ON_UNRESERVED_GPUS
        return Start(
            job_id=job.job_id,
            grants=tuple(grants),
            backfilled=self.blocked_by is not None,
            fit=chosen.fit,
            domain=chosen.domain,
            backfill=backfill,
            around=around,
        )

    def _rehold(self, lent: list[Booking]) -> None:
        """Each lent booking holds again what is still free of what it held: a try that
        started nothing took none of it, and most tries start nothing."""
        ix = self.ix
        free = ix.free
        for b in lent:
            if all(m & free[i] == m for i, m in b.held):  # none of it taken: the same again
                for i, m in b.held:
                    ix.take(i, m)
                continue
            held = tuple((i, m & free[i]) for i, m in b.held if m & free[i])
            for i, m in held:
                ix.take(i, m)
            self.bookings[self.bookings.index(b)] = b._replace(held=held)
            self.held_nodes += len(held) - len(b.held)
            self.held_gpus += _gpus(held) - _gpus(b.held)

    # --- blocked: preempt, book, wait ---------------------------------------------------

    def blocked(
        self, job: JobRequest, pool: Pool, shape: Shape, why: str, preempts: list[Preempt]
    ) -> Wait:
        if why == NO_TOPOLOGY:
            wait = job.switches_wait_s or self.config.max_switch_wait_s
            detail = f"not within {job.max_switches} leaf switches yet"
            return self._wait(job, Waiting.TOPOLOGY, detail, job.submitted_at + wait)
        if why == LEAF_SOON and self.leaf_at is not None:
            soon, leaf = self.leaf_at
            if len(self.bookings) < self.config.reservation_depth:
                soon = self._book(job, pool, shape, leaf) or soon
            detail = f"one leaf switch ({self.ix.domain_name[leaf]}) holds it from then"
            return self._wait(job, Waiting.TOPOLOGY, detail, soon)
        cfg = self.config
        if cfg.preemption and job.can_preempt and self.preemptors < cfg.max_preemptors:
            got = self._preempt(job, pool, shape, preempts)
            if got is not None:
                return got
        reason = Waiting.RESOURCES if self.blocked_by is None else Waiting.PRIORITY
        if self.blocked_by is None:
            detail = self.short_words(job, pool)  # "" : the reason's own words
        else:
            detail = f"behind job {self.blocked_by}"
        at = None
        if cfg.backfill and len(self.bookings) < cfg.reservation_depth:
            at = self._book(job, pool, shape)
        if self.blocked_by is None:
            self.blocked_by = job.job_id
        return self._wait(job, reason, detail, at)

    def short_words(self, job: JobRequest, pool: Pool) -> str:
        """Why a job that asks memory found too few nodes, when held memory is part of
        it: the nodes of its pool with its GPUs free but not its memory ("" : none, the
        GPUs alone, as the reason's own words say)."""
        ask, g = asks(job), job.gpus_per_node if job.gpus_total is None else 1
        out = self.memory.out(ask, g)
        if not out:
            return ""
        member, avail = pool.member, self.ix.avail
        short = [i for i in out if member[i] and avail[i] >= g]
        if not short:
            return ""
        names = ", ".join(sorted(self.ix.nodes[i].name for i in short)[:3])
        more = f" and {len(short) - 3} more" if len(short) > 3 else ""
        memory = "all of its memory" if ask == WHOLE else f"{ask} MiB of free memory"
        return f"not enough free GPUs, or {memory} on {names}{more}"

    def _need_ok(self, job: JobRequest, pool: Pool, also: frozenset[int] = frozenset()) -> NodeOk:
        """The filter of a job's future (bookings, the leaf wait, preemption), GPUs and
        sizes alone; `also`: more nodes to leave out."""
        avoid, _ = off_limits(self.windows, job, self.now)
        inner = self._ok(job, avoid | also, None, whole_now=False)
        member = pool.member
        if inner is None:
            return member.__getitem__  # a byte: no Python frame per node asked
        return lambda i: member[i] and inner(i)

    def _book(
        self, job: JobRequest, pool: Pool, shape: Shape, leaf: int | None = None
    ) -> float | None:
        ix = self.ix
        runtime = self._runtime(job)
        need = Need(shape.g, shape.nmin, runtime, self.now, whole=job.exclusive)
        ok = self._need_ok(job, pool)
        view_now, releases = IndexView(ix, pool), self.future.releases()
        counts = counts_in(ix, job, pool)
        found = None
        if leaf is None:
            found = earliest_counted(ix, self.future, view_now, releases, need, ok, counts)
            if found is None:
                return None
            soon = self._leaf_by(job, pool, shape, found[0])  # book one leaf if it comes
            leaf = soon[1] if soon is not None else None  # within the leaf wait
        if leaf is not None:
            inner, leaf_of = ok, ix.leaf_of
            ok = lambda i: leaf_of[i] == leaf and inner(i)  # noqa: E731
            found = earliest(ix, self.future, view_now, releases, need, ok)
        if found is None:
            return None
        at, view, released = found
        if at > self.now + self.config.booking_window_s:
            return at
        # GPUs busy now first: a booking that holds free GPUs idles them until `at`
        busy = {i: m & ~ix.free[i] for i, m in released.items()}
        if job.exclusive:  # nodes partly busy now, booked whole
            busy = {i: view.masks[i] for i, m in busy.items() if m and i in view.masks}
        busy_then = CandidateView(ix, busy, shape.g)
        chosen = select_counted(ix, busy_then, counts, shape.nmin, shape.nmin, shape.g, None)
        if isinstance(chosen, str):
            chosen = select_counted(ix, view, counts, shape.nmin, shape.nmin, shape.g, None)
        if isinstance(chosen, str):
            return None
        picks = whole_nodes(ix, chosen.picks) if job.exclusive else chosen.picks
        until = at + runtime
        self.future.promise(picks, at, until)
        self.future.add(until, picks, job.job_id)
        held = tuple((i, m & ix.free[i]) for i, m in picks if m & ix.free[i])
        for i, m in held:
            ix.take(i, m)
        self.moves += 1
        self.bookings.append(Booking(job.job_id, at, until, picks, held))
        self.held_nodes += len(held)
        self.held_gpus += _gpus(held)
        return at

    def _preempt(
        self, job: JobRequest, pool: Pool, shape: Shape, preempts: list[Preempt]
    ) -> Wait | None:
        cands = self.runs.candidates(self.victims, job)
        ask, run = asks(job), self.runs.running
        # nodes whose memory stays short whoever goes: a victim's GPUs start nothing there
        also = self.memory.short_beside(ask, _of(run, cands)) if ask else frozenset()
        ok = self._need_ok(job, pool, also)
        got = choose_victims(
            self.ix,
            self.future,
            self.runs,
            cands,
            job,
            pool=pool,
            shape=shape,
            ok=ok,
            now=self.now,
            runtime=self._runtime(job),
            counts=counts_in(self.ix, job, pool),
        )
        if got is None:
            return None
        picks, victims = got
        if ask:  # and those holding the memory its nodes still lack
            more = self.memory.more_victims(ask, (i for i, _ in picks), victims, _of(run, cands))
            if more is None:
                return None
            victims = more
        self.preemptors += 1
        grace = max((v.grace_s for v in victims), default=0)
        ix = self.ix
        held = [(i, m & ix.free[i]) for i, m in picks if m & ix.free[i]]
        for i, m in held:
            ix.take(i, m)
        self.moves += 1
        until = self.now + grace + self._runtime(job)
        self.future.promise(picks, self.now, until)
        self.future.add(until, picks, job.job_id)
        for v in victims:
            self.victims.add(v.job_id)
            if v.preempted_by is None:
                preempts.append(
                    Preempt(victim_job_id=v.job_id, for_job_id=job.job_id, grace_s=v.grace_s)
                )
        names = ", ".join(str(v.job_id) for v in victims)
        return self._wait(job, Waiting.PREEMPTING, f"waiting for {names} to exit", self.now + grace)


def _of(run: Sequence[Running], cands: list[int]) -> list[Running]:
    return [run[p] for p in cands]


def _gpus(held: tuple[tuple[int, int], ...]) -> int:
    return sum(m.bit_count() for _, m in held)


def _filters(job: JobRequest, whole_now: bool = True) -> bool:
    return bool((job.exclusive and whole_now) or job.required_nodes or job.excluded_nodes)
