"""The node agent's step table (services/launcher/steps_agent.py): a step is started once
per (job, attempt, generation, step id). The same launch again waits on the step that
runs; an `adopt` (another launcher replica took the step over) gets the outcome of one
running or ended, and of one the agent never ran, that it is lost; a launch the
launcher did not sign is refused before anything is looked up."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec

from services.launcher.steps_agent import StepRunner
from services.launcher.worker_table import WorkerTable
from shared.agent_auth import GrantSigner
from shared.api import StepLaunch, StepOutcome
from shared.identity import Signer, encode_seed

SIGNER = GrantSigner(Signer(encode_seed(b"\x02" * 32)))


class Keys:
    def current(self) -> frozenset[str]:
        return frozenset({SIGNER.public_key})


class Executor:
    """What StepRunner needs of the agent: its node and the keys it trusts."""

    node = "n0"
    bus: Any = None
    trusted_keys: Any = Keys()
    accounts: Any = None
    allow_root = False
    # Declared for StepRunner's protocol, never set: only a task's start reads them.
    zygote: Any
    fence_s: float

    def __init__(self, state: Path) -> None:
        self.running: dict[int, Any] = {}
        self.table = WorkerTable(state)  # no task is started; the answers are kept there


class FakeSteps(StepRunner):
    """The step's tasks faked: each run waits for `release` and counts itself."""

    def __init__(self, state: Path) -> None:
        super().__init__(Executor(state))
        self.runs = 0
        self.release = asyncio.Event()

    async def run(self, launch: StepLaunch) -> StepOutcome:
        self.runs += 1
        await self.release.wait()
        return StepOutcome(ok=True, exit_codes=(7,), signals=(None,))


def launch(step_id: int = 0, adopt: bool = False) -> StepLaunch:
    body = StepLaunch(
        job_id=1, attempt=0, generation=0, step_id=step_id, argv=("sleep", "9"), tasks=(),
        workdir="/", adopt=adopt,
    )  # fmt: skip
    return SIGNER.sign(body, "n0", now=time.time())


async def test_a_step_runs_once_and_every_ask_for_it_gets_its_outcome(tmp_path: Path) -> None:
    steps = FakeSteps(tmp_path)
    first = asyncio.create_task(steps.outcome_of(launch()))
    await asyncio.sleep(0)
    again = asyncio.create_task(steps.outcome_of(launch()))  # the launcher retried
    adopted = asyncio.create_task(steps.outcome_of(launch(adopt=True)))  # another replica
    await asyncio.sleep(0)
    assert steps.runs == 1 and not first.done() and not adopted.done()
    steps.release.set()
    want = StepOutcome(ok=True, exit_codes=(7,), signals=(None,))
    assert list(await asyncio.gather(first, again, adopted)) == [want, want, want]
    assert await steps.outcome_of(launch(adopt=True)) == want  # ended: at once
    assert steps.runs == 1


async def test_an_adopt_of_a_step_the_agent_never_ran_says_it_is_lost(tmp_path: Path) -> None:
    steps = FakeSteps(tmp_path)
    got = await steps.outcome_of(launch(step_id=3, adopt=True))
    assert (got.ok, got.message) == (False, "step 1.3 is not known on n0: lost")
    assert steps.runs == 0


async def test_an_unsigned_adopt_is_refused_before_any_step_is_looked_up(
    tmp_path: Path,
) -> None:
    steps = FakeSteps(tmp_path)
    steps.release.set()
    await steps.outcome_of(launch())
    forged = msgspec.structs.replace(launch(adopt=True), workdir="/elsewhere")  # not as signed
    got = await steps.outcome_of(forged)
    assert (got.ok, got.exit_codes) == (False, ())  # the step's outcome is not given out
    assert got.message.startswith("node n0 refused (altered)"), got.message
    unsigned = msgspec.structs.replace(launch(adopt=True), token=None)
    assert (await steps.outcome_of(unsigned)).message.startswith("node n0 refused")
