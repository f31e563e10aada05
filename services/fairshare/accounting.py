"""Pure core: usage accounting, charged exactly once per GPU-second.

While a job runs the launcher reports usage ticks; when an attempt ends it reports a
final tick (settlement). Every tick carries the attempt's *cumulative* GPU-seconds up to
the tick's interval end, never an increment, so the ledger only has to remember the
highest cumulative it has charged per attempt:

    charge = max(0, cumulative - already_charged)

A redelivered tick, a tick that arrives after a later one, or one that arrives after
settlement charges nothing; settlement charges whatever the ticks missed. Summed over
any order of any multiset of an attempt's ticks, charges equal the final cumulative.
GPU-seconds are integers so that this holds exactly; billed usage is GPU-seconds times
the billing weight of the GPU model (default 1.0).

The ledger state per job is a frozen Struct the shell stores with the job (one row,
updated in the same transaction as the usage it adds), so a redelivered event finds the
state its first delivery left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from services.fairshare.tree import Assoc

GpuSeconds = Annotated[int, msgspec.Meta(ge=0)]
BillingWeights = Mapping[str, float]  # GPU model -> weight; missing models weigh 1.0

DEFAULT_WEIGHT = 1.0


class UsageTick(msgspec.Struct, frozen=True, kw_only=True):
    """Usage of one attempt of a job up to `at` (epoch seconds, the interval end)."""

    job_id: int
    attempt: int = 0
    user: str
    account: str
    gpu_model: str | None = None
    at: float
    gpu_seconds: GpuSeconds  # cumulative for this attempt, from its start to `at`
    final: bool = False  # settlement: the attempt ended and this is its total


class AttemptCharge(msgspec.Struct, frozen=True, kw_only=True):
    """What has been charged for one attempt so far."""

    attempt: int
    gpu_seconds: int = 0  # highest cumulative charged
    billed: float = 0.0  # billed GPU-seconds charged
    last_at: float = 0.0  # interval end of the tick that set gpu_seconds
    settled: bool = False


class JobLedger(msgspec.Struct, frozen=True, kw_only=True):
    """The charging state of one job, across its attempts (requeues, restarts)."""

    job_id: int
    attempts: tuple[AttemptCharge, ...] = ()

    @property
    def gpu_seconds(self) -> int:
        return sum(a.gpu_seconds for a in self.attempts)

    @property
    def billed(self) -> float:
        return sum(a.billed for a in self.attempts)

    def attempt(self, attempt: int) -> AttemptCharge | None:
        return next((a for a in self.attempts if a.attempt == attempt), None)


class Charge(msgspec.Struct, frozen=True, kw_only=True):
    """Usage newly charged by one tick; zero when the tick brought nothing new."""

    job_id: int
    attempt: int
    user: str
    account: str
    gpu_seconds: int = 0
    billed: float = 0.0
    at: float = 0.0

    @property
    def assoc(self) -> Assoc:
        return Assoc(self.account, self.user)


def billing_weight(weights: BillingWeights | None, gpu_model: str | None) -> float:
    if not weights or gpu_model is None:
        return DEFAULT_WEIGHT
    return float(weights.get(gpu_model, DEFAULT_WEIGHT))


def cumulative_gpu_seconds(gpus: int, started_at: float, at: float) -> int:
    """Whole GPU-seconds of `gpus` GPUs held from `started_at` to `at` (never negative)."""
    return max(0, int(gpus * (at - started_at)))


def charge(
    ledger: JobLedger | None, tick: UsageTick, weights: BillingWeights | None = None
) -> tuple[JobLedger, Charge]:
    """Apply one tick to a job's ledger: the new ledger and what to add to usage."""
    state = ledger or JobLedger(job_id=tick.job_id)
    if state.job_id != tick.job_id:
        raise ValueError(f"tick for job {tick.job_id} applied to ledger of job {state.job_id}")
    before = state.attempt(tick.attempt) or AttemptCharge(attempt=tick.attempt)
    nothing = Charge(
        job_id=tick.job_id, attempt=tick.attempt, user=tick.user, account=tick.account, at=tick.at
    )
    if before.settled:
        return state, nothing
    delta = max(0, tick.gpu_seconds - before.gpu_seconds)
    if delta == 0 and not tick.final:
        return state, nothing
    billed = delta * billing_weight(weights, tick.gpu_model)
    after = AttemptCharge(
        attempt=tick.attempt,
        gpu_seconds=before.gpu_seconds + delta,
        billed=before.billed + billed,
        last_at=tick.at if delta else before.last_at,
        settled=tick.final,
    )
    others = tuple(a for a in state.attempts if a.attempt != tick.attempt)
    attempts = tuple(sorted((*others, after), key=lambda a: a.attempt))
    return (
        JobLedger(job_id=state.job_id, attempts=attempts),
        msgspec.structs.replace(nothing, gpu_seconds=delta, billed=billed),
    )


def settle(
    ledger: JobLedger | None, tick: UsageTick, weights: BillingWeights | None = None
) -> tuple[JobLedger, Charge]:
    """Charge the remainder of an attempt at its end; later ticks charge nothing."""
    return charge(ledger, msgspec.structs.replace(tick, final=True), weights)


def accrue(usage: Mapping[Assoc, float], charges: tuple[Charge, ...]) -> dict[Assoc, float]:
    """Add charges' billed usage to a (decayed) per-user-association usage map."""
    out = dict(usage)
    for c in charges:
        if c.billed:
            out[c.assoc] = out.get(c.assoc, 0.0) + c.billed
    return out


def usage_by_account(usage: Mapping[Assoc, float]) -> dict[str, float]:
    """Usage charged directly to each account (not rolled up the tree)."""
    out: dict[str, float] = {}
    for assoc, value in usage.items():
        out[assoc.account] = out.get(assoc.account, 0.0) + value
    return out
