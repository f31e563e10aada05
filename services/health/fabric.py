"""Fabric reader and watcher (shell): samples the node's InfiniBand/RoCE HCA ports and
Ethernet links from sysfs, asks the site hook, and feeds `fabric_core.observe`.

sysfs is read under a root (`/` on a real node; a fake tree in tests goes through the
same code):

    <root>/sys/class/infiniband/<hca>/ports/<n>/{state,phys_state,rate,counters/*}
    <root>/sys/class/net/<if>/{operstate,carrier,speed,carrier_changes}

A name in the node's fabric list is an HCA (`mlx5_0`: every port), one port
(`mlx5_0/1`), or a netdev (`ib0`, `eth1`). With no list, every HCA found is watched,
each port from the first time it is seen up (one never up is taken for uncabled).
Sampling is a poll every `poll_s`, woken early by netlink link events where `ip monitor
link` runs (so a carrier loss is seen at once, not at the next poll).

The site hook is an executable run every `hook_s`; its stdout is JSON, a list (or
`{"faults": [...]}`) of `{"link": ..., "condition": ..., "detail": ...}` entries naming
the faults only the site can see (a subnet-manager query, `ibdiagnet`). A condition
that is not one of `FabricCondition` counts as `site`. An empty list says all is well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from services.health.catalog import FabricAction, classify_fabric
from services.health.fabric_core import (
    FabricCondition,
    FabricPolicy,
    FabricReport,
    FabricState,
    LinkKind,
    LinkSample,
    SiteVerdicts,
    faulted,
    observe,
    restated,
)
from shared.logs import kv
from shared.settings import NodeSettings

log = logging.getLogger(__name__)

IB = Path("sys/class/infiniband")
NET = Path("sys/class/net")
HOOK_TIMEOUT_S = 30.0


def parse_fabric(text: str) -> tuple[str, ...]:
    """`MUSTER_FABRIC="mlx5_0, ib0"` -> ("mlx5_0", "ib0")."""
    return tuple(p.strip() for p in text.replace(" ", ",").split(",") if p.strip())


def detect_hcas(root: Path) -> tuple[str, ...]:
    base = root / IB
    return tuple(sorted(p.name for p in base.iterdir())) if base.is_dir() else ()


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # a down netdev answers EINVAL for carrier and speed
        return None


def _int(path: Path) -> int | None:
    raw = _text(path)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _ib_rate(raw: str | None) -> float | None:
    """ "200 Gb/sec (4X HDR)" -> 200.0."""
    try:
        return float(raw.split()[0]) if raw else None
    except ValueError:
        return None


def read_port(root: Path, hca: str, port: str) -> LinkSample:
    base = root / IB / hca / "ports" / port
    state = _text(base / "state") or "unknown"
    phys = _text(base / "phys_state") or ""
    counters: dict[str, int] = {}
    folder = base / "counters"
    if folder.is_dir():
        for f in folder.iterdir():
            value = _int(f)
            if value is not None:
                counters[f.name] = value
    return LinkSample(
        link=f"{hca}/{port}",
        kind=LinkKind.IB,
        up="ACTIVE" in state.upper() and (not phys or "LINKUP" in phys.upper()),
        state=f"{state} ({phys})" if phys else state,
        rate_gbps=_ib_rate(_text(base / "rate")),
        counters=counters,
    )


def read_netdev(root: Path, name: str) -> LinkSample:
    base = root / NET / name
    oper = _text(base / "operstate") or "missing"
    carrier = _int(base / "carrier")
    speed = _int(base / "speed")
    return LinkSample(
        link=name,
        kind=LinkKind.ETH,
        # A dummy or a tunnel says "unknown" while up: the carrier is what counts.
        up=carrier == 1 and oper in ("up", "unknown"),
        state=oper if carrier is not None else f"{oper} (no carrier)",
        rate_gbps=speed / 1000 if speed is not None and speed > 0 else None,
        carrier_changes=_int(base / "carrier_changes"),
    )


def read_links(root: Path, names: Sequence[str]) -> list[LinkSample]:
    """One sample per watched link; a named link that does not exist reads as down."""
    out: list[LinkSample] = []
    for name in names or detect_hcas(root):
        hca, _, port = name.partition("/")
        if (root / IB / hca).is_dir():
            ports = (
                [port] if port else sorted(p.name for p in (root / IB / hca / "ports").iterdir())
            )
            out.extend(read_port(root, hca, p) for p in ports)
        else:
            out.append(read_netdev(root, name))
    return out


def parse_hook_output(raw: str) -> SiteVerdicts:
    """The hook's JSON -> {link: (condition, detail)}; raises ValueError when unreadable."""
    data = json.loads(raw or "[]")
    entries = data.get("faults", []) if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise ValueError("expected a list of faults")
    verdicts: dict[str, tuple[FabricCondition, str]] = {}
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("link"), str):
            raise ValueError(f"a fault needs a 'link': {e!r}")
        try:
            cond = FabricCondition(str(e.get("condition", "site")))
        except ValueError:
            cond = FabricCondition.SITE
        if cond in (FabricCondition.LINK_BOUNCED, FabricCondition.RESTATED):
            cond = FabricCondition.SITE
        verdicts[e["link"]] = (cond, str(e.get("detail", "site hook")))
    return verdicts


async def run_hook(path: str) -> SiteVerdicts | None:
    """Run the site hook once; None when it failed (its last verdicts then stand)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as err:
        log.warning("fabric hook not run", extra=kv(hook=path, error=repr(err)))
        return None
    try:
        async with asyncio.timeout(HOOK_TIMEOUT_S):
            out, err_text = await proc.communicate()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        log.warning("fabric hook timed out", extra=kv(hook=path))
        return None
    if proc.returncode != 0:
        log.warning(
            "fabric hook failed", extra=kv(hook=path, rc=proc.returncode, err=err_text[-200:])
        )
        return None
    try:
        return parse_hook_output(out.decode(errors="replace"))
    except ValueError as err:
        log.warning("fabric hook output unreadable", extra=kv(hook=path, error=str(err)))
        return None


Report = Callable[[FabricReport, str], Awaitable[None]]


class FabricWatcher:
    """Samples the links every `poll_s` (sooner on a netlink event) and the hook every
    `hook_s`, and hands each report to `report(report, source)`."""

    def __init__(
        self,
        report: Report | None = None,
        *,
        names: Sequence[str] = (),
        root: Path = Path("/"),
        policy: FabricPolicy | None = None,
        poll_s: float = 1.0,
        hook: str = "",
        hook_s: float = 60.0,
        netlink: bool = True,
        clock: Callable[[], float],
    ) -> None:
        self.report = report
        self.names = tuple(names)
        self.root = root
        self.state = FabricState(policy=policy or FabricPolicy())
        self.poll_s = poll_s
        self.hook = hook
        self.hook_s = hook_s
        self.netlink = netlink and shutil.which("ip") is not None and root == Path("/")
        self.clock = clock
        self.site: SiteVerdicts = {}
        self.on_clean: Callable[[], Awaitable[None]] | None = None  # problems all gone
        self._had_problems = False
        self._seen_up: set[str] = set()
        self._restated = False
        self._wake = asyncio.Event()

    @property
    def watching(self) -> bool:
        return bool(self.names or detect_hcas(self.root) or self.hook)

    def faults(self) -> dict[str, tuple[FabricCondition, str]]:
        return faulted(self.state)

    def problems(self) -> tuple[str, ...]:
        """What a health check must not pass while it lasts: a link at a fault that
        drains the node, or one down now (an agent just restarted has not judged it
        yet). A fault that only keeps the node out of multi-node jobs fails no check:
        the node is healthy for single-node work."""
        held = {
            n: (c, d)
            for n, (c, d) in self.faults().items()
            if classify_fabric(n, c).action is FabricAction.DRAIN_NODE
        }
        down = [n for n, t in sorted(self.state.links.items()) if not t.up and n not in held]
        return (
            *(f"fabric {n}: {c} ({d})" for n, (c, d) in held.items()),
            *(f"fabric {n}: down" for n in down),
        )

    async def run(self, stop: asyncio.Event) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._poll(stop))
            if self.hook:
                group.create_task(self._hooks(stop))
            if self.netlink:
                group.create_task(self._netlink(stop))

    async def sample(self) -> tuple[FabricReport, ...]:
        samples = await asyncio.to_thread(read_links, self.root, self.names)
        if not self.names:
            # Found, not named: a port never seen up since the agent started is taken
            # for an uncabled one (a second port of a dual-port HCA), not for a fault.
            self._seen_up |= {s.link for s in samples if s.up}
            samples = [s for s in samples if s.link in self._seen_up]
        self.state, reports = observe(self.state, samples, self.clock(), self.site)
        if not self._restated:  # after the faults this round raised, so they count
            self._restated = True
            reports = (*reports, restated())
        for r in reports:
            if self.report is None:
                continue
            source = (
                "site" if r.link in self.site or r.condition is FabricCondition.SITE else "sysfs"
            )
            await self.report(r, source)
        problems = bool(self.problems())
        if self._had_problems and not problems and self.on_clean is not None:
            await self.on_clean()
        self._had_problems = problems
        return reports

    async def _poll(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample()
            self._wake.clear()
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(
                    waits, timeout=self._next_sample_s(), return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)

    def _next_sample_s(self) -> float:
        """The poll interval, or sooner when a link that is down will have been down
        for the grace by then: its fault is raised on time, not at the next poll."""
        now, grace = self.clock(), self.state.policy.down_grace_s
        due = [
            t.down_since + grace - now
            for t in self.state.links.values()
            if t.down_since is not None and t.fault is None
        ]
        return max(0.02, min([self.poll_s, *due]))

    async def _hooks(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            verdicts = await run_hook(self.hook)
            if verdicts is not None and verdicts != self.site:
                self.site = verdicts
                self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.hook_s)

    async def _netlink(self, stop: asyncio.Event) -> None:
        """Wake the poll on every link event `ip monitor link` prints."""
        try:
            proc = await asyncio.create_subprocess_exec(
                "ip", "-o", "monitor", "link", stdout=asyncio.subprocess.PIPE
            )
        except OSError as err:
            log.info("no netlink events: polling only", extra=kv(error=repr(err)))
            return
        assert proc.stdout is not None
        try:
            while not stop.is_set():
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), timeout=0.5)
                except TimeoutError:
                    continue
                if not line:
                    return  # `ip` ended: the poll still runs
                self._wake.set()
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def watcher_from(
    settings: NodeSettings, clock: Callable[[], float], configured: Sequence[str] = ()
) -> FabricWatcher:
    """The node agent's fabric watch, as its settings (MUSTER_FABRIC_*) describe it: the
    links MUSTER_FABRIC names, else those the cluster configuration gives the node
    (`configured`), else every HCA found."""
    policy = FabricPolicy(
        down_grace_s=settings.fabric_down_grace_s,
        stable_s=settings.fabric_stable_s,
        flap_max=settings.fabric_flap_max,
        flap_window_s=settings.fabric_flap_window_s,
        error_threshold=settings.fabric_error_threshold,
        error_window_s=settings.fabric_error_window_s,
    )
    return FabricWatcher(
        names=parse_fabric(settings.fabric) or tuple(configured),
        root=Path(settings.fabric_root or "/"),
        policy=policy,
        poll_s=settings.fabric_poll_s,
        hook=settings.fabric_hook,
        hook_s=settings.fabric_hook_s,
        clock=clock,
    )
