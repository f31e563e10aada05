"""Discrete-event trace simulator over the placer's pure core.

Simulated time jumps from event to event (arrivals, completions at the recorded
durations, preemption kills after the grace time, node failures and repairs); the clock
is never read. `place()` runs only after an event that can change a decision, and only
when some GPU is free or a job without GPUs waits; it sees at most `queue_depth` pending
jobs, the head of the queue in placer order (Slurm's default_queue_depth, in effect).
Node failures come from an MTBF through a seeded `random.Random` passed in, so a run is
reproducible. A job killed by preemption or a failure is requeued and starts over.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from services.placer.core import (
    MUSTER_POLICY,
    JobRequest,
    Node,
    PolicyConfig,
    Running,
    Snapshot,
    order_key,
    place,
)
from services.placer.core.order import ranked, standing_key
from services.placer.core.predict import Outcome, Predictor
from shared.states import NodeState
from sim.baselines import SLURM, slurm_priority
from sim.limits import REALISTIC, LimitModel, limit_of
from sim.metrics import Ledger, SimResult
from sim.workload import TraceJob

PriorityFn = Callable[[JobRequest, float, Mapping[str, float]], float]

# the baselines plan on limits and keep the queue in submit order (within priority)
TEXTBOOK: dict[str, Any] = {"use_predictions": False, "service_weight": 0.0, "max_wait_s": None}

POLICIES: dict[str, PolicyConfig] = {
    "fifo": PolicyConfig(strict_order=True, backfill=False, preemption=False, **TEXTBOOK),
    "easy": PolicyConfig(backfill=True, reservation_depth=1, preemption=False, **TEXTBOOK),
    "slurm": SLURM,  # with slurm_priority (sim/baselines.py) unless told another
    "muster": MUSTER_POLICY,  # the real placer's default: predictions, order, age bound
}

DONE, KILL, FAIL, REPAIR = "done", "kill", "fail", "repair"


def request(job: TraceJob, limits: LimitModel) -> JobRequest:
    return JobRequest(
        job_id=job.job_id,
        user=job.user,
        account=job.account,
        tier=job.tier,
        can_preempt=job.can_preempt,
        submitted_at=job.submit_s,
        nodes_min=job.nodes,
        nodes_max=job.nodes,
        gpus_per_node=job.gpus_per_node,
        gpus_total=job.gpus_total,
        time_limit_s=limit_of(job, limits),
    )


class Simulation:
    """The mutable world of one run; `run()` below is the way in."""

    def __init__(
        self,
        workload: Sequence[TraceJob],
        cluster: tuple[Node, ...],
        config: PolicyConfig,
        *,
        priority_fn: PriorityFn | None,
        queue_depth: int,
        limits: LimitModel,
    ) -> None:
        self.jobs = {j.job_id: j for j in workload}
        self.arrivals = sorted(workload, key=lambda j: (j.submit_s, j.job_id))
        self.nodes = {n.name: n for n in cluster}
        self.node_tuple: tuple[Node, ...] | None = None  # self.nodes' values, made once
        self.config = config
        self.priority_fn = priority_fn
        self.queue_depth = queue_depth
        self.requests = {j.job_id: request(j, limits) for j in workload}
        self.pending: list[tuple[tuple[Any, ...], int]] = []  # (sort key, job id)
        self.running: dict[int, Running] = {}
        self.attempt: dict[int, int] = {}
        self.events: list[tuple[float, int, str, int | str, int]] = []
        self.seq = 0
        self.ledger = Ledger(cluster)
        self.passes = 0
        self.special = 0  # pending jobs that need no free GPU to be served
        self.free_gpus = sum(sum(g.healthy for g in n.gpus) for n in cluster)
        self.predictor = Predictor()  # learns each finished job, as the placer does
        self.predicted: dict[int, int] = {}  # job id: predicted runtime at its start
        # outcomes the predictor has learned, by user: every history it keeps is one
        # user's (predict.keys_of), so a job's prediction changes only with its user's
        self.learned: dict[str, int] = {}
        # job id: (learned, the request, it with its prediction), as last made
        self.with_prediction: dict[int, tuple[int, JobRequest, JobRequest]] = {}
        # the core ranks by score with an age bound (order.py): the queue is kept by
        # score, and by submit time for the aged jobs that go first
        self.ranked = bool(
            config.service_weight
            or config.age_weight
            or config.max_wait_s is not None
            or config.protect_oldest
        )
        self.by_submit: list[tuple[float, int]] = []
        # a queued job's entry in each sorted list: found by bisection when it starts
        self.entry: dict[int, tuple[tuple[Any, ...], int]] = {}
        self.submit_entry: dict[int, tuple[float, int]] = {}
        widest = max((j.gpus for j in workload), default=1)  # the soonest size-scaled bound
        ref = config.age_ref_gpus
        self.age_scale = min(1.0, ref / widest) if ref and widest > ref else 1.0

    def push(self, at: float, kind: str, subject: int | str, attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, subject, attempt))

    def enqueue(self, job_id: int) -> None:
        req = self.requests[job_id]
        if self.ranked:  # by the core's score, its prediction taken once, at enqueue
            req = self.requests[job_id] = self._with_prediction(req)
            key: tuple[Any, ...] = standing_key(req, self.config)
            insort(self.by_submit, (req.submitted_at, job_id))
            self.submit_entry[job_id] = (req.submitted_at, job_id)
        else:
            key = order_key(req)
        insort(self.pending, (key, job_id))
        self.entry[job_id] = (key, job_id)
        self.special += self._special(job_id)

    def _special(self, job_id: int) -> bool:
        """Jobs a full cluster can still serve: no GPUs needed, or allowed to preempt."""
        return self.jobs[job_id].gpus == 0 or self.jobs[job_id].can_preempt

    def loop(self) -> None:
        ai, n = 0, len(self.arrivals)
        while ai < n or self.events:
            t = min(
                self.arrivals[ai].submit_s if ai < n else math.inf,
                self.events[0][0] if self.events else math.inf,
            )
            changed = False
            while self.events and self.events[0][0] <= t:
                changed |= self.handle(t, heapq.heappop(self.events))
            while ai < n and self.arrivals[ai].submit_s <= t:
                self.enqueue(self.arrivals[ai].job_id)
                changed = True
                ai += 1
            if changed and self.pending and (self.free_gpus > 0 or self.special):
                self.schedule(t)

    def handle(self, t: float, event: tuple[float, int, str, int | str, int]) -> bool:
        _, _, kind, subject, attempt = event
        if kind in (DONE, KILL):
            assert isinstance(subject, int)
            if self.attempt.get(subject) != attempt or subject not in self.running:
                return False  # a stale event: the run it belonged to already ended
            self.finish(t, subject, requeue=kind == KILL)
            return True
        assert isinstance(subject, str)
        return self.node_event(t, kind, subject)

    def finish(self, t: float, job_id: int, *, requeue: bool) -> None:
        run = self.running.pop(job_id)
        gpus = sum(len(g.gpus) for g in run.grants)
        self.free_gpus += sum(
            len(g.gpus) for g in run.grants if self.nodes[g.node].state is NodeState.UP
        )
        self.ledger.ended(job_id, run, t, gpus, requeued=requeue)
        if requeue:
            self.enqueue(job_id)
        else:
            req = self.requests[job_id]
            self.predictor.learn(
                Outcome(req.user, req.name, gpus, req.time_limit_s, t - run.started_at)
            )
            self.learned[req.user] = self.learned.get(req.user, 0) + 1

    def node_event(self, t: float, kind: str, name: str) -> bool:
        """Failure hooks: a failed node goes DOWN, its jobs are requeued; repair brings it back."""
        node = self.nodes[name]
        healthy = sum(g.healthy for g in node.gpus)
        if kind == FAIL and node.state is NodeState.UP:
            for job_id in [
                j for j, r in self.running.items() if any(g.node == name for g in r.grants)
            ]:
                self.finish(t, job_id, requeue=True)
            self.nodes[name] = msgspec.structs.replace(node, state=NodeState.DOWN)
            self.node_tuple = None
            self.free_gpus -= healthy
            self.ledger.failures += 1
            return True
        if kind == REPAIR and node.state is NodeState.DOWN:
            self.nodes[name] = msgspec.structs.replace(node, state=NodeState.UP)
            self.node_tuple = None
            self.free_gpus += healthy
            return True
        return False

    def schedule(self, t: float) -> None:
        head = [self.requests[j] for _, j in self.pending[: self.queue_depth]]
        if self.ranked:
            head = self._ranked_head(t)
        if self.priority_fn is not None:
            head = self._reprioritised(t)
        if self.config.use_predictions:
            head = [self._with_prediction(r) for r in head]
        if self.node_tuple is None:  # the same tuple until a node changes: the core
            self.node_tuple = tuple(self.nodes.values())  # keeps its skeleton by identity
        snap = Snapshot(nodes=self.node_tuple, running=tuple(self.running.values()))
        plan = place(snap, head, now=t, config=self.config)
        self.passes += 1
        started = {s.job_id for s in plan.starts}
        if started:
            _remove(self.pending, [self.entry.pop(j) for j in started])
            if self.ranked:
                _remove(self.by_submit, [self.submit_entry.pop(j) for j in started])
            self.special -= sum(self._special(j) for j in started)
        for s in plan.starts:
            self.start(t, s.job_id, s.grants)
        for w in plan.waits:
            if w.estimated_start is not None:
                self.ledger.estimated(w.job_id, w.estimated_start)
        for p in plan.preemptions:
            victim = self.running.get(p.victim_job_id)
            if victim is not None and victim.preempted_by is None:
                self.running[p.victim_job_id] = msgspec.structs.replace(
                    victim, preempted_by=p.for_job_id
                )
                self.ledger.preemptions += 1
                self.push(t + p.grace_s, KILL, p.victim_job_id, self.attempt[p.victim_job_id])

    def _ranked_head(self, t: float) -> list[JobRequest]:
        """The first queue_depth jobs in the core's order at t: the aged ones (oldest
        first) and the best-scored, ranked together."""
        depth = self.queue_depth
        ids = [j for _, j in self.pending[:depth]]
        if self.config.max_wait_s is not None:
            cut = t - self.config.max_wait_s * self.age_scale
            ids += [j for at, j in self.by_submit[:depth] if at <= cut]
        if self.config.protect_oldest:
            ids += [j for _, j in self.by_submit[:1]]  # the head the core protects
        reqs = [self.requests[j] for j in dict.fromkeys(ids)]
        return ranked(reqs, t, self.config)[:depth]

    def _with_prediction(self, req: JobRequest) -> JobRequest:
        kept = self.with_prediction.get(req.job_id)
        learned = self.learned.get(req.user, 0)
        if kept is not None and kept[0] == learned and kept[1] is req:
            return kept[2]  # nothing learned of its user since, the same request: the same
        out = self._predict(req)
        self.with_prediction[req.job_id] = (learned, req, out)
        return out

    def _predict(self, req: JobRequest) -> JobRequest:
        got = self.predictor.for_job(req)
        if got is None:
            self.predicted.pop(req.job_id, None)
            return req
        self.predicted[req.job_id] = got.seconds
        return msgspec.structs.replace(req, predicted_s=got.seconds)

    def _reprioritised(self, t: float) -> list[JobRequest]:
        assert self.priority_fn is not None
        usage = self.ledger.usage_at(t, self.running)
        fresh = [
            msgspec.structs.replace(r, priority=self.priority_fn(r, t, usage))
            for r in (self.requests[j] for _, j in self.pending)
        ]
        fresh.sort(key=order_key)
        return fresh[: self.queue_depth]

    def start(self, t: float, job_id: int, grants: tuple[msgspec.Struct, ...]) -> None:
        req = self.requests[job_id]
        run = Running(
            job_id=job_id,
            user=req.user,
            account=req.account,
            tier=req.tier,
            priority=req.priority,
            started_at=t,
            time_limit_s=req.time_limit_s,
            grants=grants,  # type: ignore[arg-type]
            predicted_s=self.predicted.get(job_id),
        )
        self.running[job_id] = run
        attempt = self.attempt[job_id] = self.attempt.get(job_id, 0) + 1
        self.free_gpus -= sum(len(g.gpus) for g in run.grants)
        runtime = min(self.jobs[job_id].duration_s, req.time_limit_s)
        self.push(t + runtime, DONE, job_id, attempt)
        self.ledger.started(job_id, run, self.jobs[job_id], self.nodes)


def run(
    workload: Sequence[TraceJob],
    cluster: tuple[Node, ...],
    policy: str | PolicyConfig = "muster",
    *,
    priority_fn: PriorityFn | None = None,
    mtbf_s: float | None = None,
    repair_s: float = 3600.0,
    rng: random.Random | None = None,
    queue_depth: int = 100,
    limits: LimitModel = REALISTIC,
) -> SimResult:
    """Replay `workload` on `cluster` under a policy (fifo, easy, slurm, muster or a
    PolicyConfig).

    priority_fn(job, now, gpu_seconds_by_account) -> priority, if given, re-ranks the queue
    at every pass (a fair-share hook). mtbf_s turns on node failures, drawn from `rng`
    (required then) per node, each repaired after repair_s. Jobs without a limit of
    their own get one from `limits` (sim/limits.py: drawn over-estimates by default,
    PADDED for the old 1.5 x runtime); a job still running at its limit is killed.
    """
    config = POLICIES[policy] if isinstance(policy, str) else policy
    name = policy if isinstance(policy, str) else "custom"
    if name == "slurm" and priority_fn is None:
        priority_fn = slurm_priority
    sim = Simulation(
        workload,
        cluster,
        config,
        priority_fn=priority_fn,
        queue_depth=queue_depth,
        limits=limits,
    )
    if mtbf_s is not None:
        if rng is None:
            raise ValueError("mtbf_s needs an rng (random.Random(seed)) for reproducible failures")
        _plan_failures(sim, mtbf_s, repair_s, rng)
    began = time.perf_counter()
    sim.loop()
    return sim.ledger.result(name, sim.jobs, passes=sim.passes, wall_s=time.perf_counter() - began)


def _remove(entries: list[Any], gone: list[Any]) -> None:
    """Take entries out of a sorted list of distinct entries (each is there)."""
    for e in gone:
        k = bisect_left(entries, e)
        if k == len(entries) or entries[k] != e:
            raise AssertionError(f"{e} is not queued")
        del entries[k]


def _plan_failures(sim: Simulation, mtbf_s: float, repair_s: float, rng: random.Random) -> None:
    horizon = max((j.submit_s + j.duration_s for j in sim.jobs.values()), default=0.0) * 2
    for name in sorted(sim.nodes):
        t = rng.expovariate(1.0 / mtbf_s)
        while t < horizon:
            sim.push(t, FAIL, name)
            sim.push(t + repair_s, REPAIR, name)
            t += repair_s + rng.expovariate(1.0 / mtbf_s)
