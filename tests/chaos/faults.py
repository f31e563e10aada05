"""Shell: carries out one scheduled fault on a running chaos bed and undoes it.

Each kind is one function: SIGKILL and restart, SIGSTOP and SIGCONT (of a service
replica or a node agent), a node's crash (every process of it killed at once, its
agent started again) or freeze (every process of it stopped, then continued), kill -9
and restart of PostgreSQL or a NATS server on the same port and folder, a partition
healed, an XID injected (a node-failing one resumed by an operator after the hold). The
undo runs in `finally`, so a cancelled run never leaves a process stopped or a node cut
off. Each fault is recorded with when it began
and was undone (wall clock, the same clock the database reports on this machine).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from muster.client import call
from shared.api import NodeAction, Ok
from tests.chaos.machine import node_processes
from tests.chaos.schedule import Fault, Kind
from tests.chaos.workload import SUBMIT_ERRORS
from tests.support.cluster import inject, kill9

if TYPE_CHECKING:
    from tests.chaos.bed import ChaosBed

APP_XID = 13  # a user's bug: fails the job on that GPU, never the node
NODE_XID = 79  # fallen off the bus: the node is FAILED until an operator resumes it
CRASH_LOOKS = 5  # passes over /proc that a node's crash takes at most


@dataclass
class FaultRecord:
    fault: Fault
    began: float
    undone: float = 0.0
    recovered_s: float | None = None  # from `began` to the next progress after `undone`


async def carry_out(bed: ChaosBed, fault: Fault) -> FaultRecord:
    record = FaultRecord(fault, time.time())
    async with _held(bed, fault):
        await asyncio.sleep(fault.hold_s)
    record.undone = time.time()
    return record


@contextlib.asynccontextmanager
async def _held(bed: ChaosBed, fault: Fault) -> AsyncIterator[None]:
    kind, target = fault.kind, fault.target
    if kind in (Kind.KILL_SERVICE, Kind.KILL_AGENT):
        key = target if kind is Kind.KILL_SERVICE else f"node-{target}"
        await asyncio.to_thread(kill9, bed.cluster, key)
        try:
            yield
        finally:
            bed.cluster.respawn(key)
    elif kind in (Kind.PAUSE_SERVICE, Kind.PAUSE_AGENT):
        key = target if kind is Kind.PAUSE_SERVICE else f"node-{target}"
        bed.cluster.kill(key, signal.SIGSTOP)
        try:
            yield
        finally:
            bed.cluster.kill(key, signal.SIGCONT)
    elif kind is Kind.KILL_POSTGRES:
        await asyncio.to_thread(bed.pg.kill)
        try:
            yield
        finally:
            await asyncio.to_thread(bed.restart_postgres)
    elif kind is Kind.KILL_NATS:
        await asyncio.to_thread(bed.kill_nats, target)
        try:
            yield
        finally:
            await asyncio.to_thread(bed.restart_nats, target)
    else:
        async with _node_fault(bed, fault):
            yield


@contextlib.asynccontextmanager
async def _node_fault(bed: ChaosBed, fault: Fault) -> AsyncIterator[None]:
    if fault.kind is Kind.CRASH_NODE:
        await asyncio.to_thread(crash, bed, fault.target)
        try:
            yield
        finally:
            bed.cluster.respawn(f"node-{fault.target}")
        return
    if fault.kind is Kind.FREEZE_NODE:
        frozen = await asyncio.to_thread(freeze, bed, fault.target)
        try:
            yield
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        return
    if fault.kind is Kind.PARTITION:
        await asyncio.to_thread(bed.partition, fault.target)
        try:
            yield
        finally:
            await asyncio.to_thread(bed.heal, fault.target)
        return
    xid = APP_XID if fault.kind is Kind.XID_APP else NODE_XID
    with contextlib.suppress(*SUBMIT_ERRORS):  # the agent may be away: then no fault lands
        await inject(bed.url, fault.target, xid, fault.gpu)
    try:
        yield
    finally:
        if fault.kind is Kind.XID_NODE:
            await resume(bed.url, fault.target)


async def resume(url: str, node: str) -> None:
    """An operator returns a node to service (refused if it is not out: that is fine)."""
    with contextlib.suppress(*SUBMIT_ERRORS):
        await call(url, "resume", NodeAction(user="root", node=node, reason="chaos"), Ok)


def freeze(bed: ChaosBed, node: str) -> list[int]:
    """The node stops whole, as a paused VM or a machine stalled on its disk: its agent,
    stepds and workers SIGSTOPped (a process forked meanwhile is found by the next
    look); what was stopped, to SIGCONT together."""
    workdir = bed.folder / "work"
    frozen: list[int] = []
    for _ in range(CRASH_LOOKS):
        new = [p for p in node_processes(node, bed.cluster.state_dir, workdir) if p not in frozen]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        frozen += new
    return frozen


def crash(bed: ChaosBed, node: str) -> None:
    """The node dies whole, as on a power loss or a kernel panic: its agent, stepds and
    workers at one instant, none told, nothing written on the way out. Each is stopped
    first (SIGSTOP: none sees another end), then killed; a process forked meanwhile is
    found by the next look."""
    key = f"node-{node}"
    workdir = bed.folder / "work"
    for _ in range(CRASH_LOOKS):
        pids = node_processes(node, bed.cluster.state_dir, workdir)
        if not pids:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
    kill9(bed.cluster, key)  # reaped: the bed restarts it
