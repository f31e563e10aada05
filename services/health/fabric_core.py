"""Pure core of the node probe's fabric watch: InfiniBand/RoCE ports and Ethernet links,
sampled, turned into faults with flap damping and a stable period before they clear.

    observe(state, samples, now, site={}) -> (state, reports)

Each `LinkSample` is one reading of one link (`fabric.read_links` makes them from
sysfs). The conditions, strongest first:

    LINK_DOWN       down for `down_grace_s` (a shorter bounce is damped: counted, warned)
    LINK_FLAPPING   `flap_max` bounces within `flap_window_s`, each one short or not
    ERRORS_RISING   error counters rose by `error_threshold` within `error_window_s`
    SPEED_DEGRADED  up, at a rate below the expected one (or the best this link had)
    LINK_BOUNCED    one damped bounce: a warning only, never a fault

A link reports a fault when a condition first holds (or a stronger one than it holds),
and reports it cleared only after `stable_s` with no condition at all: one bounce does
not requeue a training run, and a link that comes back is trusted only once it stays
back. Bounces the poll did not see are counted from `link_downed` (InfiniBand) or
`carrier_changes` (Ethernet: two per bounce). A site hook's verdicts (`site`) hold like
any condition, so they clear after the same stable period once the hook stops saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

import msgspec

# What counts as an error (link_downed counts bounces instead).
ERROR_COUNTERS = (
    "symbol_error",
    "port_rcv_errors",
    "link_error_recovery",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
LINK_DOWNED = "link_downed"


class LinkKind(StrEnum):
    IB = "ib"  # an HCA port under /sys/class/infiniband (InfiniBand or RoCE)
    ETH = "eth"  # a netdev under /sys/class/net


class FabricCondition(StrEnum):
    LINK_DOWN = "link_down"
    LINK_FLAPPING = "link_flapping"
    ERRORS_RISING = "errors_rising"
    SPEED_DEGRADED = "speed_degraded"
    SITE = "site"  # a site hook's verdict that names no condition of ours
    LINK_BOUNCED = "link_bounced"  # warning only
    # Not a condition: an agent's first round restates which of its links are at fault
    # (`FabricReport.faulted` travels with it), so the monitor drops what an earlier run
    # of the agent left (link "", cleared).
    RESTATED = "restated"


# Strongest first: a held fault is escalated, never weakened, while it lasts.
_RANK = {
    c: i
    for i, c in enumerate(
        (
            FabricCondition.LINK_DOWN,
            FabricCondition.LINK_FLAPPING,
            FabricCondition.SITE,
            FabricCondition.ERRORS_RISING,
            FabricCondition.SPEED_DEGRADED,
        )
    )
}


class FabricPolicy(msgspec.Struct, frozen=True, kw_only=True):
    down_grace_s: float = 2.0  # down shorter than this: a bounce, damped
    flap_window_s: float = 300.0
    flap_max: int = 3  # bounces within the window: flapping
    stable_s: float = 30.0  # no condition this long before a fault clears
    error_window_s: float = 60.0
    error_threshold: int = 50  # error counter increments within the window
    expected_rate_gbps: float | None = None  # None: the best rate this link has had


class LinkSample(msgspec.Struct, frozen=True, kw_only=True):
    link: str  # "mlx5_0/1" (HCA port) or "ib0" (netdev)
    kind: LinkKind
    up: bool
    state: str = ""  # as read: "4: ACTIVE", "down", ...
    rate_gbps: float | None = None
    counters: dict[str, int] = {}
    carrier_changes: int | None = None


class LinkTrack(msgspec.Struct, frozen=True, kw_only=True):
    """What the core remembers of one link between samples."""

    link: str
    up: bool = True
    down_since: float | None = None
    bounces: tuple[float, ...] = ()  # when each bounce (down event) was seen
    errors: tuple[tuple[float, int], ...] = ()  # (when, increments) within the window
    counters: dict[str, int] = {}
    carrier_changes: int | None = None
    best_rate: float | None = None
    fault: FabricCondition | None = None
    detail: str = ""
    clean_since: float | None = None
    site_only: bool = False  # known from the site hook alone, never sampled


class FabricState(msgspec.Struct, frozen=True, kw_only=True):
    policy: FabricPolicy = FabricPolicy()
    links: dict[str, LinkTrack] = {}


class FabricReport(msgspec.Struct, frozen=True, kw_only=True):
    """A fault raised, escalated or cleared on `link`; or a warning (LINK_BOUNCED)."""

    link: str
    condition: FabricCondition
    detail: str = ""
    cleared: bool = False


SiteVerdicts = Mapping[str, tuple[FabricCondition, str]]
_Held = tuple[FabricCondition, str] | None


def observe(
    state: FabricState, samples: Sequence[LinkSample], now: float, site: SiteVerdicts | None = None
) -> tuple[FabricState, tuple[FabricReport, ...]]:
    """Fold one round of samples (and the site hook's verdicts) into the state. A link
    missing from `samples` keeps its history; only the hook's own faults clear when the
    hook stops naming them."""
    p = state.policy
    links = dict(state.links)
    reports: list[FabricReport] = []
    verdicts = dict(site or {})
    for s in samples:
        track, warned = _sampled(links.get(s.link) or _first(s, now), s, now, p)
        reports.extend(warned)
        bounced = bool(warned) or track.bounces[-1:] == (now,)
        links[s.link], out = _judge(
            track, _condition(track, s, now, p), verdicts.pop(s.link, None), now, p, s.up, bounced
        )
        reports.extend(out)
    for link, verdict in verdicts.items():  # a link only the hook knows
        track = links.get(link) or LinkTrack(link=link, site_only=True)
        links[link], out = _judge(track, None, verdict, now, p)
        reports.extend(out)
    named = {s.link for s in samples} | set(site or {})
    for link, track in state.links.items():
        if link not in named and (track.site_only or track.fault is FabricCondition.SITE):
            links[link], out = _judge(track, None, None, now, p)
            reports.extend(out)
    return FabricState(policy=p, links=links), tuple(reports)


def _first(s: LinkSample, now: float) -> LinkTrack:
    return LinkTrack(
        link=s.link,
        up=s.up,
        down_since=None if s.up else now,
        counters=dict(s.counters),
        carrier_changes=s.carrier_changes,
        best_rate=s.rate_gbps,
    )


def _sampled(
    t: LinkTrack, s: LinkSample, now: float, p: FabricPolicy
) -> tuple[LinkTrack, list[FabricReport]]:
    """Update the history: bounces (seen or counted), errors, the best rate."""
    went_down = t.up and not s.up
    came_up = not t.up and s.up
    hidden = _hidden_bounces(t, s, went_down, came_up)
    new_bounces = [now] * (hidden + (1 if went_down else 0))
    warned: list[FabricReport] = []
    if came_up and t.down_since is not None and now - t.down_since < p.down_grace_s:
        warned.append(_bounce(s.link, f"down {now - t.down_since:.1f}s, damped"))
    elif hidden and s.up:
        warned.append(_bounce(s.link, f"{hidden} bounce(s) between samples, damped"))
    rose = sum(
        max(0, s.counters.get(c, 0) - t.counters.get(c, 0))
        for c in ERROR_COUNTERS
        if c in s.counters
    )
    errors = tuple(e for e in t.errors if now - e[0] < p.error_window_s)
    best = max((r for r in (t.best_rate, s.rate_gbps) if r is not None), default=None)
    t = msgspec.structs.replace(
        t,
        up=s.up,
        down_since=(t.down_since if not t.up else now) if not s.up else None,
        bounces=(*(b for b in t.bounces if now - b < p.flap_window_s), *new_bounces),
        errors=(*errors, (now, rose)) if rose else errors,
        counters=dict(s.counters),
        carrier_changes=s.carrier_changes,
        best_rate=best if s.up else t.best_rate,
    )
    return t, warned


def _hidden_bounces(t: LinkTrack, s: LinkSample, went_down: bool, came_up: bool) -> int:
    """Bounces the counters saw but these two samples did not."""
    if LINK_DOWNED in s.counters and LINK_DOWNED in t.counters:
        return max(0, s.counters[LINK_DOWNED] - t.counters[LINK_DOWNED] - (1 if went_down else 0))
    if s.carrier_changes is not None and t.carrier_changes is not None:
        changes = s.carrier_changes - t.carrier_changes - (1 if went_down or came_up else 0)
        return max(0, changes) // 2
    return 0


def _bounce(link: str, detail: str) -> FabricReport:
    return FabricReport(link=link, condition=FabricCondition.LINK_BOUNCED, detail=detail)


def _condition(t: LinkTrack, s: LinkSample, now: float, p: FabricPolicy) -> _Held:
    """The strongest condition that holds on the link now, with what shows it."""
    if not s.up and t.down_since is not None and now - t.down_since >= p.down_grace_s:
        return FabricCondition.LINK_DOWN, f"{s.state or 'down'} for {now - t.down_since:.1f}s"
    if len(t.bounces) >= p.flap_max:
        return FabricCondition.LINK_FLAPPING, (
            f"{len(t.bounces)} bounces in {p.flap_window_s:.0f}s"
        )
    rose = sum(n for _, n in t.errors)
    if rose >= p.error_threshold:
        return FabricCondition.ERRORS_RISING, f"{rose} errors in {p.error_window_s:.0f}s"
    want = p.expected_rate_gbps or t.best_rate
    if s.up and s.rate_gbps is not None and want is not None and s.rate_gbps < want:
        return FabricCondition.SPEED_DEGRADED, f"{s.rate_gbps:g} of {want:g} Gb/s"
    return None


def _judge(
    t: LinkTrack,
    own: _Held,
    site: _Held,
    now: float,
    p: FabricPolicy,
    up: bool = True,
    bounced: bool = False,
) -> tuple[LinkTrack, list[FabricReport]]:
    """Raise (or escalate) the strongest of what the link shows and what the hook says;
    with neither, run the stable period and clear the fault at its end."""
    held = min((h for h in (own, site) if h is not None), key=lambda h: _RANK[h[0]], default=None)
    if held is not None:
        cond, detail = held
        if t.fault is None or _RANK[cond] < _RANK[t.fault]:
            t = msgspec.structs.replace(t, fault=cond, detail=detail, clean_since=None)
            return t, [FabricReport(link=t.link, condition=cond, detail=detail)]
        return msgspec.structs.replace(t, clean_since=None), []
    if t.fault is None:
        return t, []
    if not up:  # down within the grace: no fault yet, but no stable spell either
        return msgspec.structs.replace(t, clean_since=None), []
    since = now if t.clean_since is None or bounced else t.clean_since
    if now - since < p.stable_s:
        return msgspec.structs.replace(t, clean_since=since), []
    cleared = FabricReport(
        link=t.link, condition=t.fault, detail=f"stable for {now - since:.0f}s", cleared=True
    )
    return msgspec.structs.replace(t, fault=None, detail="", clean_since=None), [cleared]


def faulted(state: FabricState) -> dict[str, tuple[FabricCondition, str]]:
    """The links that hold a fault now (a health check fails while any does)."""
    return {n: (t.fault, t.detail) for n, t in sorted(state.links.items()) if t.fault is not None}


def restated() -> FabricReport:
    """The report an agent's first round ends with: its links at fault are all there is."""
    return FabricReport(
        link="", condition=FabricCondition.RESTATED, detail="as the agent started", cleared=True
    )
