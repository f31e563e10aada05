"""Pure: the per-user submission rate limit, a token bucket.

A user holds up to `burst` tokens, refilled at `rate` per second; each submission takes
one. The bucket is a value: `take` returns the next bucket and, when it is empty, the
refusal (with the limit, the value and how long to wait), so the shell only stores it.
"""

from __future__ import annotations

import msgspec


class Bucket(msgspec.Struct, frozen=True, kw_only=True):
    tokens: float
    at: float  # when `tokens` was counted


class RateRefusal(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    retry_after_s: float


def take(
    bucket: Bucket | None, now: float, *, rate: float, burst: int, user: str
) -> tuple[Bucket, RateRefusal | None]:
    """Spend one token of `user`'s bucket at `now` (a new user starts full)."""
    if bucket is None:
        bucket = Bucket(tokens=float(burst), at=now)
    tokens = min(float(burst), bucket.tokens + max(0.0, now - bucket.at) * rate)
    if tokens >= 1.0:
        return Bucket(tokens=tokens - 1.0, at=now), None
    wait = (1.0 - tokens) / rate
    refusal = RateRefusal(
        message=f"{user!r} is submitting faster than the limit: at most {burst} submissions at "
        f"once (limits.submit_burst = {burst}), then {rate:g} per second (limits.submit_rate "
        f"= {rate:g}); wait {wait:.1f} s and submit again, or use a job array",
        retry_after_s=wait,
    )
    return Bucket(tokens=tokens, at=now), refusal
