"""Pure core, queue order: which pending job is tried first in a pass.

Within a tier (high first), jobs are ranked by a multifactor score:

    score = priority - service_weight x log2(1 + predicted GPU-hours)
                     + age_weight x hours waited

The predicted GPU-hours count the job's GPUs times `predicted^t x limit^(1-t)` seconds,
`t` being `order_trust` (0.5 in MUSTER_POLICY: the geometric mean of the prediction and
the job's own limit). A prediction is the mean of a few other jobs' runtimes (predict.py)
and can be wrong by a factor of 20 either way, where the limit is the user's own word
and never below the runtime: trusted alone, a history that said "minutes" put a wide job
that then ran for days in front of the queue (on Kalos that cost more than shortest-first
gained: docs/sim-report.md, *Issue 20, round 11*). Hedged, the prediction still moves a
job by half its say; planning (backfill holes, bookings) uses the prediction itself.

`priority` is the fair-share service's (account fair share, age, QOS ...), so the
service term orders jobs *inside* each account's share; it favours the jobs that free
the queue soonest (shortest predicted service first, which minimises the mean wait),
counted on the predicted runtime where there is one (predict.py), else the limit.
Shortest-first starves wide and long jobs, so an age term bounds the wait: a job that
has waited `max_wait_s` loses its service term (score = its priority), which puts it
ahead of every younger job of equal or lower priority, oldest first, and the first of
those gets the pass's first booking. It does not jump a clearly higher fair-share
priority: a queue saturated for days is still served by fair share (a hard jump let an
under-served account's older backlog take 43% against its 30% share). With `age_weight`
the age term is linear too, Slurm's age factor without its cap: every hour waited adds
`age_weight` to the score, so a wide or long job climbs past the small ones steadily
rather than all at once at the bound (the tail is what the linear term bounds best:
docs/sim-report.md). Requeued jobs (a fault or preemption put them back) go first among
equals; then submit time and id.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import msgspec

from services.placer.core.model import JobRequest, PolicyConfig

RankKey = tuple[int, float, bool, float, int]
TailKey = tuple[float, bool, float, int]


def gpus_of(job: JobRequest) -> int:
    if job.gpus_total is not None:
        return job.gpus_total
    return job.nodes_min * job.gpus_per_node


def ranked(jobs: Sequence[JobRequest], now: float, config: PolicyConfig) -> list[JobRequest]:
    """The jobs in pass order: by `rank_key`, and with `protect_oldest` the oldest job
    of the top tier and priority (not held, no blocker) first, EASY's protected head."""
    tail = _tail_keyer(now, config)
    tiers = {j.tier for j in jobs}
    if len(tiers) <= 1:
        out = sorted(jobs, key=tail)
    else:  # by tier, high first, each sorted by the rest of rank_key: the same order
        out = []
        for t in sorted(tiers, reverse=True):
            out += sorted((j for j in jobs if j.tier == t), key=tail)
    if not config.protect_oldest or not out:
        return out
    tier = out[0].tier
    best = max(j.priority for j in out if j.tier == tier)
    free = [
        j
        for j in out
        if j.tier == tier and j.priority == best and not j.held and j.blocked_by is None
    ]
    if not free:
        return out
    head = min(free, key=lambda j: (j.submitted_at, j.job_id))
    return [head, *(j for j in out if j is not head)]


def wait_bound(job: JobRequest, config: PolicyConfig) -> float:
    """How long the job waits before the age bound puts it ahead (`max_wait_s`, sooner
    for a job wider than `age_ref_gpus`)."""
    bound = config.max_wait_s if config.max_wait_s is not None else math.inf
    ref = config.age_ref_gpus
    gpus = gpus_of(job)
    return bound * ref / gpus if ref and gpus > ref else bound


def rank_key(job: JobRequest, now: float, config: PolicyConfig) -> RankKey:
    """Sort key of a pending job at `now`: smaller goes first (see the module doc)."""
    return _keyer(now, config)(job)


def standing_key(job: JobRequest, config: PolicyConfig) -> RankKey:
    """`rank_key` before any age bound is reached, in an order that holds at every
    `now`: the linear age term adds the same to every job per second waited, so it is
    counted from the epoch (a queue kept sorted by this needs no re-sort as time passes;
    the aged jobs are the caller's to merge, as `ranked` orders them)."""
    return _keyer(0.0, msgspec.structs.replace(config, max_wait_s=None))(job)


def _keyer(now: float, config: PolicyConfig) -> Callable[[JobRequest], RankKey]:
    """`rank_key` at `now`: the tier, then `_tail_keyer`'s key."""
    tail = _tail_keyer(now, config)

    def key(job: JobRequest) -> RankKey:
        score, fresh, sub, job_id = tail(job)
        return (-job.tier, score, fresh, sub, job_id)

    return key


def _tail_keyer(now: float, config: PolicyConfig) -> Callable[[JobRequest], TailKey]:
    """`rank_key` at `now` without its tier, as one flat function: the same arithmetic in
    the same order (a pass sorts every pending job by it: 50,000 calls in
    bench/placer_scale.py). `ranked` sorts each tier by it: a float first makes the sort's
    comparisons the fast ones, where a tier shared by most jobs made each go through the
    whole tuple."""
    sw, aw, use = config.service_weight, config.age_weight, config.use_predictions
    bound, ref, trust = config.max_wait_s, config.age_ref_gpus, config.order_trust
    log2 = math.log2

    def key(job: JobRequest) -> TailKey:
        sub = job.submitted_at
        total = job.gpus_total
        gpus = job.nodes_min * job.gpus_per_node if total is None else total
        aged = False
        if bound is not None:
            aged = now - sub >= (bound * ref / gpus if ref and gpus > ref else bound)
        score = job.priority
        if sw and not aged:
            p, limit = job.predicted_s, job.time_limit_s
            if p is None or not use or limit < 1:
                runtime: float = limit
            else:  # the prediction within [1 s, the limit], then hedged by the limit
                q = limit if p > limit else (p if p > 1 else 1)
                runtime = q if trust == 1.0 else limit * (q / limit) ** trust
            score -= sw * log2(1.0 + (gpus if gpus > 1 else 1) * runtime / 3600.0)
        if aw:
            score += aw * (now - sub) / 3600.0
        return (-score, not job.requeued, sub, job.job_id)

    return key
