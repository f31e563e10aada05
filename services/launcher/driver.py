"""What the coordinator's helpers (upkeep.py, cleaning.py) use of it, as a Protocol:
they take the coordinator through this, so neither imports coordinator.py, which
builds both (no import cycle, not even one hidden under TYPE_CHECKING)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.launcher import coordinator_core as core
from services.launcher import repo
from services.launcher.effects import EffectRunner
from services.launcher.gang import Agents
from services.launcher.observations import Choose
from services.launcher.owners import Owners
from shared.db import Conn
from shared.events import AnyEvent, Event
from shared.runtime import ServiceContext
from shared.settings import LauncherSettings

Check = Callable[[Conn, repo.Run], Awaitable[bool]]


class Driver(Protocol):
    """The coordinator as its timers, reconcile and node cleaning see it."""

    ctx: ServiceContext[LauncherSettings]
    settings: LauncherSettings
    config: core.CoordinatorConfig
    agents: Agents
    effects: EffectRunner

    owners: Owners

    def lock(self, job_id: int) -> asyncio.Lock: ...

    def owns(self, job_id: int) -> bool: ...

    def mine(self, job_ids: list[int]) -> list[int]: ...

    def acting_on(self, shard: int) -> bool: ...

    async def dispatch(self, job_id: int, event: AnyEvent) -> None: ...

    async def observe(
        self, job_id: int, choose: Choose, event: Event | None = None, check: Check | None = None
    ) -> None: ...

    async def start_allocation(self, job_id: int, attempt: int, event: Event | None) -> None: ...

    async def settle_orphan(self, job_id: int) -> None: ...

    async def end_stopped(self, job_id: int) -> None: ...

    async def offer_growth(self) -> None: ...
