"""Shell: where a generation's rank 0 listens (MASTER_ADDR, MASTER_PORT): the nodes'
addresses from the database and a port that rank 0's agent found free.

Both are on the path of every start and neither needs the run's row, so a new
allocation asks for them while its start transaction runs (`early`), and `launch` takes
that answer (`take`) instead of asking after the commit: 2.5 ms of a 35 ms start on a
2-core machine. An answer is kept only for the generation it was asked for, and only
when rank 0 is the node it was asked of; anything else asks again (`ask`).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from services.launcher import repo
from services.launcher.gang import Agents, Generation
from shared.api import AgentReply
from shared.db import Pool
from shared.logs import kv

log = logging.getLogger(__name__)
MAX_KEPT = 1_000  # answers nobody took (a start given up meanwhile) are forgotten past it


class Meeting(msgspec.Struct, frozen=True, kw_only=True):
    """What `nodes` (rank 0 first) were asked: their addresses, rank 0's free port."""

    nodes: tuple[str, ...]
    addresses: dict[str, str]
    port: AgentReply

    @property
    def master(self) -> str:
        """Rank 0's address (a node with no address recorded: this host)."""
        return self.addresses.get(self.nodes[0], "127.0.0.1")


class Rendezvous:
    def __init__(self, pool: Pool, agents: Agents) -> None:
        self.pool = pool
        self.agents = agents
        self._kept: dict[tuple[int, int, int], Meeting] = {}

    async def ask(self, nodes: tuple[str, ...]) -> Meeting:
        """Ask now: the addresses and the port at once (neither needs the other)."""
        addresses, port = await asyncio.gather(
            self._addresses(nodes), self.agents.free_port(nodes[0])
        )
        return Meeting(nodes=nodes, addresses=addresses, port=port)

    async def early(self, nodes: tuple[str, ...]) -> Meeting | None:
        """`ask`, for a start not yet committed: None instead of an error (the start
        asks again once it is committed, and says then what went wrong)."""
        if not nodes:
            return None
        try:
            return await self.ask(nodes)
        except Exception as err:  # asked again, and reported, by launch
            log.debug("rendezvous asked early failed", extra=kv(nodes=nodes, error=repr(err)))
            return None

    async def _addresses(self, nodes: tuple[str, ...]) -> dict[str, str]:
        async with self.pool.acquire() as conn:
            return await repo.node_addresses(conn, list(nodes))

    def keep(self, gen: Generation, meeting: Meeting | None) -> None:
        """`meeting` for `gen`'s launch, if it was asked of `gen`'s nodes and rank 0."""
        if meeting is None or not meeting.port.ok or not _fits(meeting, gen):
            return
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        self._kept[_key(gen)] = meeting

    def take(self, gen: Generation) -> Meeting | None:
        """The meeting kept for `gen`, once."""
        return self._kept.pop(_key(gen), None)


def _key(gen: Generation) -> tuple[int, int, int]:
    return (gen.job_id, gen.attempt, gen.generation)


def _fits(meeting: Meeting, gen: Generation) -> bool:
    return (
        bool(gen.nodes)
        and meeting.nodes[0] == gen.nodes[0]
        and set(meeting.nodes) == set(gen.nodes)
    )
