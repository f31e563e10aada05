"""The effects runner (services/launcher/effects.py): commit order per job, best-effort
stops and stops ahead of a start under way beside the chain, and every task owned and
settled at close. Agents are a fake that records what it was asked, in order."""

from __future__ import annotations

import asyncio

import pytest

from services.launcher.coordinator_core import SignalWorkers, StopWorkers
from services.launcher.effects import EffectRunner, Effects
from services.launcher.gang import Generation
from shared.api import AgentReply
from shared.jobspec import JobSpec

SPEC = JobSpec(user="alice", script="train.sh")


def gen(job_id: int = 7, generation: int = 1) -> Generation:
    return Generation(job_id=job_id, attempt=1, generation=generation, nodes=("a",), gpus={})


class FakeAgents:
    """Node agents that answer after `delays[node]` seconds (forever: never)."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        self.calls: list[tuple[str, int, tuple[str, ...]]] = []
        self.delays = delays or {}
        self.keys: list[tuple[int, int | None] | None] = []

    async def stop(
        self, job_id: int, nodes: tuple[str, ...], grace_s: float,
        key: tuple[int, int | None] | None = None,
    ) -> dict[str, AgentReply]:  # fmt: skip
        self.calls.append(("stop", job_id, nodes))
        self.keys.append(key)
        await asyncio.sleep(max(self.delays.get(n, 0.0) for n in nodes))
        return {n: AgentReply(ok=True) for n in nodes}

    async def signal(self, job_id: int, act: SignalWorkers) -> None:
        self.calls.append(("signal", job_id, act.nodes))


class Recorder:
    def __init__(self, agents: FakeAgents, launch_s: float = 0.0) -> None:
        self.agents, self.launch_s = agents, launch_s
        self.launched = asyncio.Event()

    async def launch(self, _spec: JobSpec, g: Generation) -> None:
        await asyncio.sleep(self.launch_s)
        self.agents.calls.append(("start", g.job_id, g.nodes))
        self.launched.set()

    async def end_stopped(self, job_id: int) -> None:
        self.agents.calls.append(("end", job_id, ()))


def runner(agents: FakeAgents, launch_s: float = 0.0, rec: Recorder | None = None) -> EffectRunner:
    rec = rec or Recorder(agents, launch_s)
    return EffectRunner(agents, rec.launch, rec.end_stopped)


async def test_a_later_decisions_stop_never_overtakes_an_earlier_start() -> None:
    agents = FakeAgents()
    fx = runner(agents, launch_s=0.2)
    fx.enqueue(Effects(spec=SPEC, job_id=7, start=gen()))
    fx.enqueue(Effects(spec=SPEC, job_id=7, stops=[StopWorkers(nodes=("a",), grace_s=1)],
                       end_delay_s=0.0))  # fmt: skip
    await fx.close(5.0)
    assert agents.calls == [("start", 7, ("a",)), ("stop", 7, ("a",)), ("end", 7, ())]


AHEAD = {
    "a stop of one generation, its start under way: sent at once, and again in order": (
        (1, 1), True,
        [("stop", 7, ("a",)), ("start", 7, ("a",)), ("stop", 7, ("a",)), ("end", 7, ())],
    ),
    "a stop of any generation of the attempt (a resumed stop, upkeep.py): in order only": (
        (1, None), True, [("start", 7, ("a",)), ("stop", 7, ("a",)), ("end", 7, ())],
    ),
    "nothing under way: the chain's stop alone": (
        (1, 1), False, [("stop", 7, ("a",)), ("end", 7, ())],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("key", "starting", "want"), AHEAD.values(), ids=AHEAD.keys())
async def test_a_stop_decided_while_its_start_is_under_way_goes_ahead_of_it(
    key: tuple[int, int | None], starting: bool, want: list[tuple[str, int, tuple[str, ...]]]
) -> None:
    """The agent keeps a stop of a generation it has not started, and hands one of a
    start under way (a slow prolog) to its stepd: the job never begins. The chain's
    own stop still comes after the start, whose answer the run's end waits on."""
    agents = FakeAgents()
    fx = runner(agents, launch_s=0.2)
    if starting:
        fx.enqueue(Effects(spec=SPEC, job_id=7, start=gen()))
    stops = [StopWorkers(nodes=("a",), grace_s=1)]
    fx.enqueue(Effects(spec=SPEC, job_id=7, stop_key=key, stops=stops, end_delay_s=0.0))
    await fx.close(5.0)
    assert agents.calls == want
    assert set(agents.keys) == {key}


async def test_a_best_effort_stop_of_a_lost_node_holds_up_neither_the_stops_nor_the_restart() -> (
    None
):
    agents = FakeAgents(delays={"lost": 60.0})
    rec = Recorder(agents)
    fx = runner(agents, rec=rec)
    stops = [
        StopWorkers(nodes=("lost",), grace_s=1, best_effort=True),
        StopWorkers(nodes=("b",), grace_s=1),
    ]
    fx.enqueue(Effects(spec=SPEC, job_id=7, stops=stops, start=gen()))
    await asyncio.wait_for(rec.launched.wait(), 5.0)
    assert agents.calls == [("stop", 7, ("lost",)), ("stop", 7, ("b",)), ("start", 7, ("a",))]
    assert not fx.busy(7)  # the chain is done; only the best-effort ask is still out
    await fx.close(0.05)


async def test_close_waits_for_the_effects_in_hand_then_cancels_the_rest_and_refuses_more() -> None:
    agents = FakeAgents()
    fx = runner(agents, launch_s=60.0)
    fx.enqueue(Effects(spec=SPEC, job_id=7, start=gen()))
    fx.enqueue(Effects(spec=SPEC, job_id=8, end_delay_s=0.0))
    assert fx.busy(7) and fx.busy(8)
    await fx.close(0.2)
    assert agents.calls == [("end", 8, ())]  # done in time; job 7's launch was cut short
    assert not fx.busy(7)
    fx.enqueue(Effects(spec=SPEC, job_id=9, end_delay_s=0.0))
    await asyncio.sleep(0.05)
    assert not fx.busy(9) and ("end", 9, ()) not in agents.calls


HOLDS = {
    "no stop: nothing to wait for": ([], False),
    "a stop of live nodes keeps the GPUs held until it is answered": (
        [StopWorkers(nodes=("a",), grace_s=1)], True,
    ),
    "a best-effort stop alone does not": (
        [StopWorkers(nodes=("lost",), grace_s=1, best_effort=True)], False,
    ),
    "a stop of no node does not": ([StopWorkers(nodes=(), grace_s=1)], False),
}  # fmt: skip


@pytest.mark.parametrize(("stops", "want"), HOLDS.values(), ids=HOLDS.keys())
def test_holds_gpus(stops: list[StopWorkers], want: bool) -> None:
    assert Effects(spec=SPEC, job_id=7, stops=stops).holds_gpus() is want


async def test_a_replica_that_lost_the_job_acts_on_no_agent_and_stops_with_the_key() -> None:
    agents = FakeAgents()
    rec = Recorder(agents)
    owned = {7}
    fx = EffectRunner(agents, rec.launch, rec.end_stopped, owns=lambda job: job in owned)
    keyed = [StopWorkers(nodes=("a",), grace_s=1)]
    fx.enqueue(Effects(spec=SPEC, job_id=7, stop_key=(2, 3), stops=keyed, start=gen()))
    fx.enqueue(Effects(spec=SPEC, job_id=8, stops=keyed, start=gen(), end_delay_s=0.0))
    await fx.close(5.0)
    assert agents.calls == [("stop", 7, ("a",)), ("start", 7, ("a",))]
    assert agents.keys == [(2, 3)]
