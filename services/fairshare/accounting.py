"""Pure core: usage accounting, charged exactly once per GPU-second.

While a job runs the launcher reports usage ticks; when an attempt ends it reports a
final tick (settlement). Every tick carries the attempt's *cumulative* GPU-seconds up to
the tick's interval end, never an increment, so the ledger only has to remember the
highest cumulative it has charged per attempt:

    charge = max(0, cumulative - already_charged)      (a tick)
    charge = final_total - already_charged             (the settlement)

A redelivered tick, a tick that arrives after a later one, or one that arrives after
settlement charges nothing; settlement charges whatever the ticks missed, or gives back
what a tick stamped past the attempt's end overcharged. Summed over
any order of any multiset of an attempt's ticks, charges equal the final cumulative
(exactly, for whole GPU-seconds; the state itself always holds the exact maximum).
Billed usage is GPU-seconds times the billing weight of the GPU model (default 1.0);
the model is remembered from the first tick that names it, so a settlement that does
not name it is billed alike.

The state per attempt (`AttemptCharge`) is one `usage_charges` row: the shell loads it
FOR UPDATE, calls `charge`, and writes it back with the usage it adds in the same
transaction, so a redelivered event finds the state its first delivery left.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import msgspec

from services.fairshare.tree import Assoc
from shared.events import JobFinished, JobRequeued, UsageTicked

BillingWeights = Mapping[str, float]  # GPU model -> weight; missing models weigh 1.0
GpuSeconds = Annotated[float, msgspec.Meta(ge=0)]

DEFAULT_WEIGHT = 1.0


class UsageTick(msgspec.Struct, frozen=True, kw_only=True):
    """Usage of one attempt of a job up to `at` (epoch seconds, the interval end)."""

    job_id: int
    attempt: int = 0
    user: str
    account: str
    gpu_model: str | None = None
    at: float = 0.0
    gpu_seconds_total: GpuSeconds  # cumulative for this attempt, from its start to `at`
    final: bool = False  # settlement: the attempt ended and this is its total


class AttemptCharge(msgspec.Struct, frozen=True, kw_only=True):
    """What has been charged for one attempt so far (one `usage_charges` row)."""

    job_id: int
    attempt: int
    user: str
    account: str
    charged: float = 0.0  # highest cumulative GPU-seconds charged
    billed: float = 0.0  # billed GPU-seconds charged (charged x billing weight)
    last_at: float = 0.0  # interval end of the tick that last raised `charged`
    settled: bool = False
    gpu_model: str | None = None


class Charge(msgspec.Struct, frozen=True, kw_only=True):
    """Usage newly charged by one tick; zero when the tick brought nothing new."""

    job_id: int
    attempt: int
    user: str
    account: str
    gpu_seconds: float = 0.0
    billed: float = 0.0
    at: float = 0.0

    @property
    def assoc(self) -> Assoc:
        return Assoc(self.account, self.user)


def billing_weight(weights: BillingWeights | None, gpu_model: str | None) -> float:
    if not weights or not gpu_model:
        return DEFAULT_WEIGHT
    return float(weights.get(gpu_model, DEFAULT_WEIGHT))


def cumulative_gpu_seconds(gpus: int, started_at: float, at: float) -> float:
    """GPU-seconds of `gpus` GPUs held from `started_at` to `at` (never negative)."""
    return max(0.0, gpus * (at - started_at))


def charge(
    state: AttemptCharge | None, tick: UsageTick, weights: BillingWeights | None = None
) -> tuple[AttemptCharge, Charge]:
    """Apply one tick to its attempt's charge state: the new state and what to add.

    `state` is None for an attempt never charged before. A tick charges
    `max(0, tick.gpu_seconds_total - state.charged)`; the settlement charges the
    difference to its total, negative if a tick overshot; once settled, nothing more.
    """
    before = state or AttemptCharge(
        job_id=tick.job_id, attempt=tick.attempt, user=tick.user, account=tick.account
    )
    if (before.job_id, before.attempt) != (tick.job_id, tick.attempt):
        raise ValueError(
            f"tick for {tick.job_id}.{tick.attempt} applied to {before.job_id}.{before.attempt}"
        )
    nothing = Charge(
        job_id=tick.job_id,
        attempt=tick.attempt,
        user=before.user,
        account=before.account,
        at=tick.at,
    )
    if before.settled:
        return before, nothing
    delta = tick.gpu_seconds_total - before.charged
    if not tick.final:
        delta = max(0.0, delta)  # a tick is provisional: late or repeated ones add nothing
    # The settlement is the attempt's total: a tick stamped a moment past the attempt's
    # end (the chaos suite saw 6 ms) is given back here, so the charges sum to it exactly.
    if delta == 0.0 and not tick.final:
        return before, nothing
    model = before.gpu_model or tick.gpu_model
    billed = delta * billing_weight(weights, model)
    after = msgspec.structs.replace(
        before,
        charged=tick.gpu_seconds_total if delta else before.charged,
        gpu_model=model,
        billed=before.billed + billed,
        last_at=tick.at if delta else before.last_at,
        settled=tick.final,
    )
    return after, msgspec.structs.replace(nothing, gpu_seconds=delta, billed=billed)


def settle(
    state: AttemptCharge | None, tick: UsageTick, weights: BillingWeights | None = None
) -> tuple[AttemptCharge, Charge]:
    """Charge the remainder of an attempt at its end; later ticks charge nothing."""
    return charge(state, msgspec.structs.replace(tick, final=True), weights)


def tick_from_event(event: UsageTicked | JobFinished | JobRequeued) -> UsageTick:
    """The tick an event carries: `usage.ticked` while running; `job.finished` and
    `job.requeued` settle the attempt that ended."""
    at = event.occurred_at.timestamp()
    if isinstance(event, UsageTicked):
        return UsageTick(
            job_id=event.job_id,
            attempt=event.attempt,
            user=event.user,
            account=event.account,
            gpu_model=event.gpu_model or None,
            at=at,
            gpu_seconds_total=max(0.0, event.gpu_seconds_total),
        )
    if isinstance(event, JobFinished):
        at = event.ended_at.timestamp() if event.ended_at is not None else at
        model: str | None = event.gpu_model or None
    else:
        model = None
    return UsageTick(
        job_id=event.job_id,
        attempt=event.attempt,
        user=event.user,
        account=event.account,
        gpu_model=model,
        at=at,
        gpu_seconds_total=max(0.0, event.gpu_seconds),
        final=True,
    )


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
