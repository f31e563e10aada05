"""srun step tasks under stepds of their own (services/launcher/step_tasks.py), with real
processes: a zygote, its stepds and their tasks. An agent's wait cut short (it died)
leaves the tasks running; the next agent's runner resumes the step, leaves it out of
`status` until a launcher asks for it, and answers that launcher's `adopt` with the
tasks' own exits. Tasks of a job that no longer runs here are stopped instead."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.launcher.step_tasks import StepTask
from services.launcher.steps_agent import StepRunner
from services.launcher.steps_core import StepState, step_end
from services.launcher.worker_table import (
    StepExit,
    StepStarted,
    alive,
    read_struct,
    stop_recorded_workers,
)
from shared.api import StepLaunch, StepOutcome, StepStop, StepTaskSpec
from tests.support.step_runner import SIGNER, Executor

KEY = (1, 0, 0, 4)  # job, attempt, generation, step


@pytest.fixture
async def executor(tmp_path: Path) -> AsyncIterator[Executor]:
    ex = Executor(tmp_path / "state")
    try:
        yield ex
    finally:
        await asyncio.to_thread(ex.zygote.close)


def launch(tmp_path: Path, go: Path, *, adopt: bool = False) -> StepLaunch:
    """Step 1.4: two tasks that wait for `go`, then exit 5 and 6."""
    script = f"until [ -e {go} ]; do sleep 0.05; done; exit $((5 + $SLURM_PROCID))"
    tasks = tuple(
        StepTaskSpec(
            procid=i,
            env=dict(os.environ) | {"SLURM_PROCID": str(i)},
            stdout=str(tmp_path / "out" / f"{i}.out"),
            stderr=str(tmp_path / "out" / f"{i}.err"),
        )
        for i in range(2)
    )
    body = StepLaunch(
        job_id=1, attempt=0, generation=0, step_id=4, argv=("bash", "-c", script), tasks=tasks,
        workdir=str(tmp_path), adopt=adopt,
    )  # fmt: skip
    return SIGNER.sign(body, "n0", now=time.time())


async def started_tasks(state: Path, count: int) -> list[StepStarted]:
    deadline = time.monotonic() + 30
    while True:
        found = [read_struct(f / "started.json", StepStarted) for f in folders(state)]
        got = [s for s in found if s is not None]
        if len(got) == count:
            return got
        assert time.monotonic() < deadline, f"{len(got)} of {count} tasks started"
        await asyncio.sleep(0.05)


async def until(done: Callable[[], bool], what: str, within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not done():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.05)


def folders(state: Path) -> list[Path]:
    return sorted((state / "steps").glob("*"))


async def agent_dies_mid_step(ex: Executor, tmp_path: Path, go: Path) -> list[StepStarted]:
    """A runner starts the step, then its wait is cut short as an agent killed would."""
    first = StepRunner(ex)
    waiting = asyncio.create_task(first.outcome_of(launch(tmp_path, go)))
    started = await started_tasks(ex.table.state, 2)
    assert first.listed() == (KEY,)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert all(alive(s.worker) for s in started), "the tasks outlive their agent's wait"
    return started


async def test_a_resumed_step_answers_its_launchers_adopt_with_the_tasks_own_exits(
    executor: Executor, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    started = await agent_dies_mid_step(executor, tmp_path, go)
    again = StepRunner(executor)  # the next agent
    again.resume()
    assert again.listed() == (), "a resumed step is left out of status until asked for"
    asked = asyncio.create_task(again.outcome_of(launch(tmp_path, go, adopt=True)))
    await asyncio.sleep(0.2)
    assert not asked.done() and again.listed() == (KEY,)
    assert all(alive(s.worker) for s in started)
    go.touch()
    got = await asyncio.wait_for(asked, 30)
    assert (got.ok, got.exit_codes, got.signals) == (True, (5, 6), (None, None)), got
    assert folders(executor.table.state) == [], "a task's folder goes once its exit is read"
    assert await again.outcome_of(launch(tmp_path, go, adopt=True)) == got  # kept


async def test_a_step_that_ended_while_no_agent_ran_is_answered_at_once(
    executor: Executor, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    started = await agent_dies_mid_step(executor, tmp_path, go)
    go.touch()
    await until(lambda: not any(alive(s.worker) for s in started), "the tasks ended")
    again = StepRunner(executor)
    again.resume()
    got = await asyncio.wait_for(again.outcome_of(launch(tmp_path, go, adopt=True)), 10)
    assert (got.ok, got.exit_codes) == (True, (5, 6)), got


async def test_a_step_that_ended_before_its_agent_died_is_answered_by_the_next_one(
    executor: Executor, tmp_path: Path
) -> None:
    """The agent read the tasks' exits, removed their folders and was killed before its
    answer reached the launcher: the launcher's `adopt` to the next agent gets the
    step's real outcome (kept on disk, kept.py), where it was answered "lost"."""
    go = tmp_path / "go"
    go.touch()
    got = await asyncio.wait_for(StepRunner(executor).outcome_of(launch(tmp_path, go)), 30)
    assert (got.ok, got.exit_codes) == (True, (5, 6)), got
    assert folders(executor.table.state) == []
    again = StepRunner(executor)
    again.resume()
    assert await again.outcome_of(launch(tmp_path, go, adopt=True)) == got


async def test_tasks_of_a_job_that_no_longer_runs_here_are_stopped(
    executor: Executor, tmp_path: Path
) -> None:
    started = await agent_dies_mid_step(executor, tmp_path, tmp_path / "go")
    executor.running[1].ended.set()  # its worker ended while no agent ran
    again = StepRunner(executor)
    again.resume()
    state = executor.table.state

    def gone() -> bool:
        return not any(alive(s.worker) for s in started) and not folders(state)

    await until(gone, "the tasks of a job that ended stopped, their folders gone")
    lost = await again.outcome_of(launch(tmp_path, tmp_path / "go", adopt=True))
    assert (lost.ok, lost.message) == (False, "step 1.4 is not known on n0: lost")


async def test_a_task_whose_stepd_is_killed_is_killed_and_reported_lost(
    executor: Executor, tmp_path: Path
) -> None:
    runner = StepRunner(executor)
    waiting = asyncio.create_task(runner.outcome_of(launch(tmp_path, tmp_path / "go")))
    started = await started_tasks(executor.table.state, 2)
    for s in started:
        os.kill(s.stepd.pid, 9)
    got = await asyncio.wait_for(waiting, 10)
    assert got.ok and got.signals == (9, 9), got
    assert got.node_failed == (True, True), got  # the launcher ends the job's run there
    assert not any(alive(s.worker) for s in started)


async def test_tasks_their_node_fenced_are_reported_as_the_nodes_failure(
    executor: Executor, tmp_path: Path
) -> None:
    """No contact with the control plane for `fence_s` (no contact file here, so from
    each stepd's start): every stepd fences its task. The answer says stopped, and that
    the node failed them: the launcher ends the job's run there as a node fault."""
    executor.fence_s = 1.0
    runner = StepRunner(executor)
    got = await asyncio.wait_for(runner.outcome_of(launch(tmp_path, tmp_path / "go")), 30)
    assert (got.ok, got.stopped, got.node_failed) == (True, (True, True), (True, True)), got
    assert folders(executor.table.state) == []


async def test_muster_down_stops_the_step_tasks_and_each_stepd_records_the_signal(
    tmp_path: Path,
) -> None:
    cluster = tmp_path / "cluster"
    ex = Executor(cluster / "nodes" / "n0")
    try:
        started = await agent_dies_mid_step(ex, tmp_path, tmp_path / "go")
        await asyncio.to_thread(stop_recorded_workers, cluster, 0.5)
        assert not any(alive(s.worker) for s in started)
        exits = [read_struct(f / "exit.json", StepExit) for f in folders(ex.table.state)]
        assert [e.signal if e else None for e in exits] == [15, 15], exits
    finally:
        await asyncio.to_thread(ex.zygote.close)


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal is of a job as root, run by root")
async def test_a_task_its_stepd_cannot_start_fails_the_step_and_leaves_nothing(
    executor: Executor, tmp_path: Path
) -> None:
    """Each stepd spawns its task as the job's user; here (root, not allowed) stepd
    refuses: the step fails with stepd's reason, no task runs, no folder stays."""
    executor.allow_root = False  # the agent runs as root: a job as root is refused
    runner = StepRunner(executor)
    got = await asyncio.wait_for(runner.outcome_of(launch(tmp_path, tmp_path / "go")), 30)
    assert not got.ok and got.message.startswith("step did not start on n0:"), got
    assert "root" in got.message, got.message
    assert folders(executor.table.state) == [] and runner.workers == {}


async def test_a_task_is_fenced_by_its_stepd_when_the_node_loses_the_control_plane(
    executor: Executor, tmp_path: Path
) -> None:
    """The contact file is never touched (no agent reached the control plane): past
    `fence_s` each task's stepd stops it with SIGTERM, as a worker's stepd fences the
    worker; nothing else here would end a task that waits for its `go` file."""
    executor.fence_s = 1.0
    runner = StepRunner(executor)
    got = await asyncio.wait_for(runner.outcome_of(launch(tmp_path, tmp_path / "go")), 30)
    assert got.ok and got.signals == (15, 15), got  # SIGTERM, never the `go` file
    assert folders(executor.table.state) == []


@pytest.mark.parametrize("kill", [True, False])
async def test_with_k_a_task_that_exits_badly_ends_the_others_on_its_node(
    executor: Executor, tmp_path: Path, kill: bool
) -> None:
    """srun -K: task 0 exits 3 at once; task 1 would sleep a long while. With -K it is
    stopped (SIGTERM) and the node answers at once; without, it runs until released."""
    go = tmp_path / "go"
    script = f'[ "$SLURM_PROCID" = 0 ] && exit 3; until [ -e {go} ]; do sleep 0.05; done'
    tasks = tuple(
        StepTaskSpec(
            procid=i, env=dict(os.environ) | {"SLURM_PROCID": str(i)},
            stdout=str(tmp_path / "out" / f"{i}.out"), stderr=str(tmp_path / "out" / f"{i}.err"),
        )
        for i in range(2)
    )  # fmt: skip
    body = StepLaunch(
        job_id=1, attempt=0, generation=0, step_id=4, argv=("bash", "-c", script), tasks=tasks,
        workdir=str(tmp_path), kill_on_bad_exit=kill,
    )  # fmt: skip
    waiting = asyncio.create_task(
        StepRunner(executor).outcome_of(SIGNER.sign(body, "n0", now=time.time()))
    )
    done, _ = await asyncio.wait({waiting}, timeout=10 if kill else 2)
    if kill:
        assert done, "task 1 was not stopped"
        got = waiting.result()
        assert (got.exit_codes, got.signals) == ((3, None), (None, 15)), got
    else:
        assert not done, "without -K task 1 runs on"
        go.write_text("x")
        got = await asyncio.wait_for(waiting, 30)
        assert (got.exit_codes, got.signals) == ((3, 0), (None, None)), got
    assert folders(executor.table.state) == []


def stop(tmp_path: Path, sig: int = 0) -> bytes:
    """srun's Ctrl-C for the step writing under tmp_path/out, as the launcher signs it;
    with `sig`, `scancel -s SIG JOB.STEP`."""
    body = StepStop(job_id=1, attempt=0, generation=0, output_dir=str(tmp_path / "out"), signal=sig)
    return msgspec.json.encode(SIGNER.sign(body, "n0", now=time.time()))


async def test_a_signal_to_a_step_is_sent_to_its_tasks_and_ends_nothing(
    executor: Executor, tmp_path: Path
) -> None:
    """`scancel -s USR1 JOB.STEP`: each task's group gets it; a trap runs and the step
    goes on. A signal is not kept as a stop is: it came before the launch, the launch
    still runs its tasks."""
    runner = StepRunner(executor)
    early = msgspec.json.decode(
        await runner._on_stop(stop(tmp_path, signal.SIGUSR1), ""), type=StepOutcome
    )
    assert (early.ok, early.message) == (True, "signalled 0 task(s)"), early
    go = tmp_path / "go"
    waiting = asyncio.create_task(runner.outcome_of(launch(tmp_path, go)))
    await started_tasks(executor.table.state, 2)
    said = msgspec.json.decode(
        await runner._on_stop(stop(tmp_path, signal.SIGWINCH), ""), type=StepOutcome
    )
    assert (said.ok, said.message) == (True, "signalled 2 task(s)"), said  # ignored by bash
    await asyncio.sleep(0.3)
    assert not waiting.done(), "a signal the tasks ignore ends nothing"
    go.write_text("x")
    got = await asyncio.wait_for(waiting, 30)
    assert (got.exit_codes, got.stopped) == ((5, 6), (False, False)), got


async def test_a_stop_that_came_before_its_launch_starts_nothing(
    executor: Executor, tmp_path: Path
) -> None:
    """srun interrupted while its request was in flight: its stop reached the node before
    the step's launch. The launch starts no task and is answered as stopped, which the
    launcher records CANCELLED; before, the step ran on for an srun that was gone."""
    runner = StepRunner(executor)
    said = msgspec.json.decode(await runner._on_stop(stop(tmp_path), ""), type=StepOutcome)
    assert said.ok, said
    got = await asyncio.wait_for(runner.outcome_of(launch(tmp_path, tmp_path / "go")), 10)
    assert (got.ok, got.exit_codes, got.stopped) == (True, (None, None), (True, True)), got
    assert folders(executor.table.state) == [], "no task was started"
    end = step_end(got.exit_codes, got.signals, got.stopped, lost=False)
    assert end.state is StepState.CANCELLED


async def test_a_stop_before_its_launch_holds_for_the_next_agent(
    executor: Executor, tmp_path: Path
) -> None:
    """The agent that took srun's stop was killed and restarted before the launch came:
    the next agent's runner still starts nothing (kept on disk, kept.py)."""
    said = msgspec.json.decode(
        await StepRunner(executor)._on_stop(stop(tmp_path), ""), type=StepOutcome
    )
    assert said.ok, said
    again = StepRunner(executor)
    again.resume()
    got = await asyncio.wait_for(again.outcome_of(launch(tmp_path, tmp_path / "go")), 10)
    assert (got.ok, got.stopped) == (True, (True, True)), got
    assert folders(executor.table.state) == [], "no task was started"


async def test_a_step_answered_before_it_started_is_answered_the_same_by_the_next_agent(
    executor: Executor, tmp_path: Path
) -> None:
    """srun's stop came first, so the launch is answered "stopped before it started".
    The agent is killed before that answer reaches the launcher. The launcher's `adopt`
    to the next agent gets the same answer; before, it got "not known: lost" and the
    step was recorded FAILED."""
    runner = StepRunner(executor)
    await runner._on_stop(stop(tmp_path), "")
    first = await asyncio.wait_for(runner.outcome_of(launch(tmp_path, tmp_path / "go")), 10)
    assert first.stopped == (True, True), first
    again = StepRunner(executor)
    again.resume()
    asked = launch(tmp_path, tmp_path / "go", adopt=True)
    assert await asyncio.wait_for(again.outcome_of(asked), 10) == first


class StopMidStart(StepRunner):
    """srun's stop arrives as the second of the step's two tasks is being started."""

    def __init__(self, executor: Executor, stop: bytes) -> None:
        super().__init__(executor)
        self.stop = stop

    async def _fork_task(self, launch: StepLaunch, task: StepTaskSpec, *args: Any) -> StepTask:
        if task.procid == 1:
            await self._on_stop(self.stop, "")
        return await super()._fork_task(launch, task, *args)


async def test_a_stop_while_the_tasks_are_being_started_ends_every_one(
    executor: Executor, tmp_path: Path
) -> None:
    """Task 1 is forked after the stop ended task 0: it is ended too, not left running
    until `go` (which never comes)."""
    runner = StopMidStart(executor, stop(tmp_path))
    waiting = runner.outcome_of(launch(tmp_path, tmp_path / "go"))
    got = await asyncio.wait_for(waiting, 30)
    assert (got.ok, got.stopped) == (True, (True, True)), got
    assert got.node_failed == (False, False), got  # srun's stop: no node failed
    assert got.signals == (15, 15), got
    assert folders(executor.table.state) == []
