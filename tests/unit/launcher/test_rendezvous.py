"""The rendezvous asked while a start commits is used only for the generation and the
rank 0 it was asked for (services/launcher/rendezvous.py); an early ask that fails is
no answer, never an error (launch asks again and reports it)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from services.launcher.gang import Generation
from services.launcher.rendezvous import Meeting, Rendezvous
from shared.api import AgentReply

OK = AgentReply(ok=True, port=29500)


def gen(
    nodes: tuple[str, ...], *, job: int = 7, attempt: int = 1, generation: int = 0
) -> Generation:
    return Generation(
        job_id=job, attempt=attempt, generation=generation, nodes=nodes,
        gpus={n: [0] for n in nodes},
    )  # fmt: skip


def meeting(nodes: tuple[str, ...], port: AgentReply = OK) -> Meeting:
    return Meeting(
        nodes=nodes, addresses={n: f"10.0.0.{i}" for i, n in enumerate(nodes)}, port=port
    )


def book() -> Rendezvous:
    return Rendezvous(cast(Any, None), cast(Any, None))  # keep/take touch neither


@pytest.mark.parametrize(
    ("asked", "started", "kept"),
    [
        (("a",), ("a",), True),
        (("a", "b"), ("a", "b"), True),
        (("a", "b"), ("b", "a"), False),  # rank 0 is another node: its port is unknown
        (("a", "b"), ("a",), False),  # shrunk meanwhile
        (("a",), ("a", "c"), False),  # a node whose address was not read
        ((), ("a",), False),
    ],
)
def test_a_meeting_is_kept_only_for_the_nodes_and_rank_0_it_was_asked_of(
    asked: tuple[str, ...], started: tuple[str, ...], kept: bool
) -> None:
    r = book()
    r.keep(gen(started), meeting(asked) if asked else None)
    assert (r.take(gen(started)) is not None) is kept


def test_a_meeting_is_taken_once_and_by_its_own_generation_only() -> None:
    r = book()
    r.keep(gen(("a",)), meeting(("a",)))
    assert r.take(gen(("a",), generation=1)) is None  # a restart asks afresh
    assert r.take(gen(("a",), attempt=2)) is None
    taken = r.take(gen(("a",)))
    assert taken is not None and taken.master == "10.0.0.0" and taken.port.port == 29500
    assert r.take(gen(("a",))) is None


def test_a_refused_port_is_not_kept() -> None:
    r = book()
    r.keep(gen(("a",)), meeting(("a",), AgentReply(ok=False, message="node a did not answer")))
    assert r.take(gen(("a",))) is None


def test_a_master_with_no_address_recorded_is_this_host() -> None:
    assert Meeting(nodes=("a",), addresses={}, port=OK).master == "127.0.0.1"


class Away:
    """A database and a bus that are both away."""

    def acquire(self) -> Any:
        raise ConnectionRefusedError("PostgreSQL is away")

    async def free_port(self, node: str) -> AgentReply:
        raise ConnectionRefusedError("NATS is away")


async def test_an_early_ask_that_fails_is_no_answer_not_an_error() -> None:
    away = Rendezvous(cast(Any, Away()), cast(Any, Away()))
    assert await away.early(("a",)) is None
    assert await away.early(()) is None
