"""The node agent's worker table (services/launcher/worker_table.py) and its step
supervisor (services/launcher/stepd.py), against real processes and files.

`judge` is a pure rule and gets a table; the pid/start-time check, the records and
stepd itself run real processes: a stepd is started exactly as the agent starts it
(`python -m services.launcher.stepd <folder>`), and what it records is read back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from services.health.probe import kernel_boot_id
from services.launcher.executor import group_members
from services.launcher.stepd_client import Stepd, Zygote, started_or_ended
from services.launcher.stepd_client import start_stepd as cold_stepd
from services.launcher.worker_table import (
    Ending,
    Facts,
    Isolation,
    ProcessRef,
    StepExit,
    StepSpec,
    StepStarted,
    Verdict,
    WorkerRecord,
    WorkerTable,
    alive,
    judge,
    process_ref,
    read_struct,
    start_time,
    stop_recorded_workers,
    touch,
    write_struct,
)

REPO = Path(__file__).resolve().parents[3]
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}

T = TypeVar("T")


def facts(**kw: bool) -> Facts:
    base = {"exit_recorded": False, "same_boot": True, "stepd_alive": False, "worker_alive": False}
    return Facts(**(base | kw))


JUDGE_CASES = {
    "an exit recorded while the agent was away is reported": (
        facts(exit_recorded=True),
        Verdict.REPORT,
    ),
    "a recorded exit wins even while its stepd is still finishing": (
        facts(exit_recorded=True, stepd_alive=True, worker_alive=False),
        Verdict.REPORT,
    ),
    "a live stepd is re-adopted": (facts(stepd_alive=True, worker_alive=True), Verdict.ADOPT),
    "a worker whose stepd was killed is unsupervised and is killed": (
        facts(stepd_alive=False, worker_alive=True),
        Verdict.KILL_ORPHAN,
    ),
    "nothing runs and nothing was recorded: the worker was lost": (
        facts(),
        Verdict.REPORT_LOST,
    ),
    "after a reboot no recorded pid can be ours, whatever matches": (
        facts(same_boot=False, stepd_alive=True, worker_alive=True),
        Verdict.REPORT_LOST,
    ),
}


@pytest.mark.parametrize(("given", "want"), JUDGE_CASES.values(), ids=JUDGE_CASES.keys())
def test_judge(given: Facts, want: Verdict) -> None:
    assert judge(given) == want


def test_a_live_process_matches_its_pid_and_start_time_and_a_reused_pid_does_not() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        ref = process_ref(proc.pid)
        assert ref is not None and alive(ref)
        assert not alive(ProcessRef(pid=proc.pid, start=ref.start - 1))  # another process
    finally:
        proc.kill()
        proc.wait()
    assert not alive(ref)


def test_a_zombie_is_not_alive_but_can_still_be_named_by_its_parent() -> None:
    proc = subprocess.Popen(["true"])
    stat = Path(f"/proc/{proc.pid}/stat")
    until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "a zombie", 10)
    try:
        assert start_time(proc.pid) is None
        assert start_time(proc.pid, zombie_ok=True) is not None
    finally:
        proc.wait()


def test_the_boot_id_is_the_kernels() -> None:
    assert kernel_boot_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_structs_are_written_whole_and_unreadable_ones_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    assert read_struct(path, StepExit) is None
    write_struct(path, StepExit(ending=Ending.EXITED, exit_code=3))
    assert read_struct(path, StepExit) == StepExit(ending=Ending.EXITED, exit_code=3)
    assert [p.name for p in tmp_path.iterdir()] == ["exit.json"]  # no temporary left
    path.write_text('{"ending": "exi')
    assert read_struct(path, StepExit) is None


def test_records_drop_folders_without_a_record_and_take_pids_from_stepd(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path)
    rec = record(table, 7)
    (table.root / "9-1-0").mkdir()  # an agent died before writing this one's record
    started = StepStarted(stepd=ProcessRef(pid=10, start=1), worker=ProcessRef(pid=11, start=2))
    write_struct(Path(rec.folder) / "started.json", started)
    [found] = table.records()
    assert found == rec
    assert table.with_pids(found) == msgspec.structs.replace(
        rec, stepd=started.stepd, worker=started.worker
    )
    assert sorted(p.name for p in table.root.iterdir()) == ["7-1-0"]
    table.remove(rec)
    assert table.records() == []


class EndsAsLookedAt(Stepd):
    """A stepd that records its exit and ends just as it is asked whether it runs: the
    moment a look at its files, then at the process, would take it for mute."""

    def __init__(self, folder: Path) -> None:
        super().__init__(os.getpid())
        self.folder = folder

    def running(self) -> bool:
        write_struct(self.folder / "exit.json", EXITED_3)
        return False


EXITED_3 = StepExit(ending=Ending.SPAWN_FAILED, spawn_failed="prolog exited 3", prolog_failed=True)


async def test_a_start_whose_stepd_ends_between_two_looks_is_told_how_it_ended(
    tmp_path: Path,
) -> None:
    assert await started_or_ended(tmp_path, EndsAsLookedAt(tmp_path), 5.0) == EXITED_3


def test_a_restarted_agent_reports_an_exit_recorded_as_its_stepd_was_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = WorkerTable(tmp_path)
    rec = record(table, 4)

    def ended_as_looked_at(ref: ProcessRef | None) -> bool:  # stepd writes its exit, ends
        write_struct(Path(rec.folder) / "exit.json", EXITED_3)
        return False

    monkeypatch.setattr("services.launcher.worker_table.alive", ended_as_looked_at)
    assert judge(table.facts(rec, kernel_boot_id())) is Verdict.REPORT
    assert table.exit_of(rec) == EXITED_3


def record(table: WorkerTable, job_id: int) -> WorkerRecord:
    rec = WorkerRecord(
        job_id=job_id,
        attempt=1,
        generation=0,
        boot_id=kernel_boot_id(),
        folder=str(table.folder(job_id, 1, 0)),
    )
    table.save(rec)
    return rec


def test_the_step_tasks_left_are_the_noted_ones_still_alive_and_their_notes_go(
    tmp_path: Path,
) -> None:
    """What the next agent ends: a noted task still running, not one that ended (its
    pid may be another process's by now) nor one whose note was taken away."""
    table = WorkerTable(tmp_path / "node")
    rec = record(table, 5)
    running = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    ended = subprocess.Popen(["true"])
    gone = subprocess.Popen(["sleep", "1000"], start_new_session=True)
    try:
        refs = [process_ref(p.pid, zombie_ok=True) for p in (running, ended, gone)]
        assert all(ref is not None for ref in refs)
        notes = [table.add_task(rec, ref) for ref in refs if ref is not None]
        ended.wait()
        notes[2].unlink()  # the agent reaped it and took its note away
        assert table.tasks_left(rec) == [refs[0]]
        assert table.tasks_left(rec) == []  # notes are read once
    finally:
        for proc in (running, gone):
            proc.kill()
            proc.wait()


# --- stepd, a real process ------------------------------------------------------------


def start_stepd(
    table: WorkerTable, job_id: int, script: str, tmp: Path, fence_s: float = 60.0
) -> tuple[WorkerRecord, subprocess.Popen[bytes]]:
    rec = prepared(table, job_id, script, tmp, fence_s)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launcher.stepd", rec.folder],
        cwd=REPO,
        start_new_session=True,
    )
    return rec, proc


def prepared(
    table: WorkerTable, job_id: int, script: str, tmp: Path, fence_s: float = 60.0
) -> WorkerRecord:
    """A worker's record and spec, for a stepd to run."""
    rec = record(table, job_id)
    spec = StepSpec(
        argv=("/bin/sh", "-c", script),
        env=ENV,
        workdir=str(tmp),
        stdout=f"out-{job_id}.txt",
        stderr=f"err-{job_id}.txt",
        allow_root=True,
        contact=str(table.contact),
        fence_s=fence_s,
        grace_s=0.5,
    )
    write_struct(Path(rec.folder) / "spec.json", spec)
    return rec


def until(check: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    """`check`'s first answer that is not None or False, within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (got := check()) is None or got is False:
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        time.sleep(0.02)
    return got


def started(table: WorkerTable, rec: WorkerRecord) -> StepStarted:
    return until(lambda: table.started(rec), "word from stepd that the worker runs", 20)


def ended(proc: subprocess.Popen[bytes], table: WorkerTable, rec: WorkerRecord) -> StepExit:
    assert proc.wait(timeout=30) == 0
    ending = table.exit_of(rec)
    assert ending is not None
    return ending


def test_stepd_records_the_exit_code_of_its_worker(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    rec, proc = start_stepd(table, 1, "echo hi; exit 3", tmp_path)
    assert ended(proc, table, rec) == StepExit(ending=Ending.EXITED, exit_code=3)
    assert (tmp_path / "out-1.txt").read_text() == "hi\n"


def test_stepd_and_its_worker_outlive_the_parent_that_started_them(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    go = tmp_path / "go"
    # The parent (a shell standing in for the agent) starts stepd and is killed.
    rec = record(table, 2)
    spec = StepSpec(
        argv=("/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 4"),
        env=ENV, workdir=str(tmp_path), stdout="o", stderr="e", allow_root=True,
        contact=str(table.contact), fence_s=60.0, grace_s=0.5,
    )  # fmt: skip
    write_struct(Path(rec.folder) / "spec.json", spec)
    parent = subprocess.Popen(
        ["/bin/sh", "-c", f"setsid {sys.executable} -m services.launcher.stepd {rec.folder} &"
         " sleep 30"],
        cwd=REPO, start_new_session=True,
    )  # fmt: skip
    pids = started(table, rec)
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait()
    assert alive(pids.stepd) and alive(pids.worker)
    go.touch()
    until(lambda: table.exit_of(rec), "recorded exit", 20)
    assert table.exit_of(rec) == StepExit(ending=Ending.EXITED, exit_code=4)


def test_stepd_fences_its_worker_group_when_the_contact_goes_stale(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    ready = tmp_path / "ready-3"
    script = f"trap '' TERM; sleep 1000 & : > {ready}; while true; do sleep 0.1; done"
    rec, proc = start_stepd(table, 3, script, tmp_path, 1.5)

    def started() -> StepStarted | None:
        touch(table.contact)
        return table.started(rec)

    def trap_set() -> bool:
        touch(table.contact)
        return ready.exists()

    # In touch until the trap is set: a slow stepd start must not be fenced before it.
    pids = until(started, "word of the worker", 20)
    until(trap_set, "word that the trap is set")
    assert len(group_members(pids.worker.pid)) >= 2
    # No touch from here on: the agent has lost the control plane.
    ending = ended(proc, table, rec)
    assert ending == StepExit(ending=Ending.FENCED, signal=signal.SIGKILL)
    assert group_members(pids.worker.pid) == []


def test_a_fresh_contact_keeps_the_worker_running(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    # A fence longer than any stall of a loaded machine between two touches.
    rec, proc = start_stepd(table, 4, "sleep 2.5", tmp_path, fence_s=5.0)
    started(table, rec)
    while proc.poll() is None:
        touch(table.contact)
        time.sleep(0.2)
    assert ended(proc, table, rec) == StepExit(ending=Ending.EXITED, exit_code=0)


def test_stop_recorded_workers_stops_every_node_s_workers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    runs = []
    for node, job in (("n1", 5), ("n2", 6)):
        table = WorkerTable(state / "nodes" / node)
        touch(table.contact)
        ready = tmp_path / f"ready-{job}"
        rec, proc = start_stepd(table, job, f"trap '' TERM; : > {ready}; sleep 1000", tmp_path)
        pids = started(table, rec)
        # A SIGTERM before the trap would end the worker itself (EXITED), not the stop
        # (STOPPED); the worker's group has two members before it too (the prologue's
        # mkdir), so the script says when it is past the trap.
        until(ready.exists, "word that the trap is set")
        runs.append((table, rec, proc, pids))
    stopped = stop_recorded_workers(state, grace_s=0.5)
    assert sorted(stopped) == sorted(pids.worker.pid for *_, pids in runs)
    for table, rec, proc, pids in runs:
        assert ended(proc, table, rec).ending is Ending.STOPPED
        assert not alive(pids.worker)


def test_a_stop_that_comes_while_the_prolog_runs_means_the_worker_never_begins(
    tmp_path: Path,
) -> None:
    """SIGTERM to stepd before its worker exists (here: while the site prolog runs) is
    kept: once the prolog is done stepd records STOPPED and spawns nothing, so no line
    of the job runs. Taken by the default action, it ended stepd alone, with nothing
    recorded and, once the worker was spawned, nobody left to stop it; kept but acted
    on only later, the worker began and was stopped right after."""
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    began, ran = tmp_path / "prolog-began", tmp_path / "ran"
    prolog = tmp_path / "prolog"
    prolog.write_text(f"#!/bin/sh\n: > {began}\nsleep 1\n")
    prolog.chmod(0o755)
    rec = prepared(table, 12, f": > {ran}; sleep 1000", tmp_path)
    spec = read_struct(Path(rec.folder) / "spec.json", StepSpec)
    assert spec is not None
    iso = Isolation(cgroups=False, prolog=str(prolog))
    write_struct(Path(rec.folder) / "spec.json", msgspec.structs.replace(spec, isolation=iso))
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.launcher.stepd", rec.folder],
        cwd=REPO, start_new_session=True,
    )  # fmt: skip
    until(began.exists, "the prolog running")
    os.kill(proc.pid, signal.SIGTERM)  # as the agent's stop, right after its start
    assert ended(proc, table, rec) == StepExit(ending=Ending.STOPPED, signal=signal.SIGTERM)
    assert table.started(rec) is None
    assert not ran.exists()


def test_a_stop_sent_while_a_cold_stepd_starts_its_interpreter_is_kept(tmp_path: Path) -> None:
    """A cold stepd (no zygote) is started with SIGTERM blocked: a stop sent before its
    interpreter has set the handlers is pending, then taken as a stop, and no worker
    begins. By the default action it ended stepd without a word."""
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    ran = tmp_path / "ran"
    rec = prepared(table, 14, f": > {ran}; sleep 1000", tmp_path)
    stepd = cold_stepd(Path(rec.folder))
    os.kill(stepd.pid, signal.SIGTERM)  # its interpreter is still starting
    assert stepd.proc is not None
    assert ended(stepd.proc, table, rec) == StepExit(ending=Ending.STOPPED, signal=signal.SIGTERM)
    assert table.started(rec) is None and not ran.exists()


# --- the stepd zygote the agent keeps ready --------------------------------------------


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[tuple[WorkerTable, Zygote]]:
    """A node's worker table and its stepd zygote, started; closed after the test."""
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    zygote = Zygote()
    zygote.warm()
    try:
        yield table, zygote
    finally:
        zygote.close()


def finished(stepd: Stepd, table: WorkerTable, rec: WorkerRecord) -> StepExit:
    """How the worker ended, once its stepd (the zygote's child, not ours) is gone."""
    assert stepd.proc is None and stepd.ref is not None  # forked, not a cold start
    until(lambda: not stepd.running(), "end of the stepd")
    ending = table.exit_of(rec)
    assert ending is not None
    return ending


async def test_forked_stepds_run_their_folders_in_sessions_of_their_own(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    table, zyg = zygote
    recs = [prepared(table, job, f"echo from-{job}; exit {job}", tmp_path) for job in (5, 6)]
    # Back to back, as a gang's restart or a job submitted as the last one ended.
    stepds = [await zyg.take(Path(rec.folder)) for rec in recs]
    for stepd, rec, job in zip(stepds, recs, (5, 6), strict=True):
        assert finished(stepd, table, rec) == StepExit(ending=Ending.EXITED, exit_code=job)
        assert (tmp_path / f"out-{job}.txt").read_text() == f"from-{job}\n"
        assert (Path(rec.folder) / "stepd.log").exists()  # its output went to the folder
    assert len({s.pid for s in stepds}) == 2 and zyg.pid not in {s.pid for s in stepds}


async def test_a_forked_stepd_supervises_and_stops_its_worker_like_a_cold_one(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    table, zyg = zygote
    rec = prepared(table, 7, "sleep 1000", tmp_path)
    stepd = await zyg.take(Path(rec.folder))
    pids = started(table, rec)
    assert pids.stepd.pid == stepd.pid and os.getsid(stepd.pid) == stepd.pid
    assert alive(pids.worker)
    os.kill(stepd.pid, signal.SIGTERM)  # as the agent's stop
    assert finished(stepd, table, rec).ending is Ending.STOPPED
    assert not alive(pids.worker)


async def test_a_killed_zygote_is_replaced_before_the_next_start_is_asked_of_it(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    table, zyg = zygote
    first = zyg.pid
    assert first is not None
    os.killpg(first, signal.SIGKILL)
    until(lambda: _gone(first), "end of the zygote")
    rec = prepared(table, 8, "exit 8", tmp_path)
    stepd = await zyg.take(Path(rec.folder))  # a dead zygote is replaced before it is asked
    assert zyg.pid not in (None, first)
    assert finished(stepd, table, rec) == StepExit(ending=Ending.EXITED, exit_code=8)


async def test_a_start_is_handed_the_spare_forked_ahead_and_the_next_spare_follows(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    table, zyg = zygote
    spare = only_spare(zyg, "the zygote's first spare")
    # Seen from the moment of its fork, its setsid just after; in a session of its own
    # while it waits.
    until(lambda: os.getsid(spare) == spare, "the spare's session of its own")
    rec = prepared(table, 10, "exit 10", tmp_path)
    stepd = await zyg.take(Path(rec.folder))
    assert stepd.pid == spare  # no fork on the start's path
    assert finished(stepd, table, rec) == StepExit(ending=Ending.EXITED, exit_code=10)
    after = only_spare(zyg, "the next spare")
    assert after != spare


async def test_a_stop_sent_to_a_spare_before_its_handlers_are_set_is_kept_not_fatal(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    """A spare is born with SIGTERM blocked: a stop that reaches it before stepd set its
    handlers (here: before it was even handed a folder; in the agent, the instant after
    the handover) is pending, then taken as a stop: STOPPED, no worker. By the default
    action it ended the spare without a word, and the start failed as a refusal."""
    table, zyg = zygote
    spare = only_spare(zyg, "the zygote's first spare")
    until(lambda: os.getsid(spare) == spare, "the spare's session of its own")
    os.kill(spare, signal.SIGTERM)
    ran = tmp_path / "ran"
    rec = prepared(table, 13, f": > {ran}; sleep 1000", tmp_path)
    stepd = await zyg.take(Path(rec.folder))
    assert stepd.pid == spare  # alive, and handed the start
    got = finished(stepd, table, rec)
    assert got == StepExit(ending=Ending.STOPPED, signal=signal.SIGTERM)
    assert table.started(rec) is None and not ran.exists()


async def test_a_killed_spare_is_replaced_when_a_start_is_asked(
    tmp_path: Path, zygote: tuple[WorkerTable, Zygote]
) -> None:
    table, zyg = zygote
    spare = only_spare(zyg, "the zygote's first spare")
    os.kill(spare, signal.SIGKILL)
    until(lambda: _gone(spare), "end of the spare")
    rec = prepared(table, 11, "exit 11", tmp_path)
    stepd = await zyg.take(Path(rec.folder))
    assert stepd.pid != spare
    assert finished(stepd, table, rec) == StepExit(ending=Ending.EXITED, exit_code=11)


def test_a_zygote_whose_agent_died_exits_and_its_stepds_run_on(tmp_path: Path) -> None:
    table = WorkerTable(tmp_path / "node")
    touch(table.contact)
    rec = prepared(table, 9, "sleep 1000", tmp_path)
    agent = subprocess.Popen(
        [
            sys.executable, "-c",
            "import asyncio, sys; from pathlib import Path;"
            " from services.launcher.stepd_client import Zygote; z = Zygote();"
            f" s = asyncio.run(z.take(Path({rec.folder!r})));"
            " print(z.pid, flush=True); sys.stdin.readline()",
        ],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert agent.stdout is not None and agent.stdin is not None
    zygote_pid = int(agent.stdout.readline())
    pids = started(table, rec)
    spares = until(lambda: (_children(zygote_pid) - {pids.stepd.pid}) or None, "the next spare")
    agent.kill()
    agent.wait(timeout=10)
    until(lambda: _gone(zygote_pid), "end of the zygote")
    until(lambda: all(_gone(p) for p in spares), "end of the spare: it runs nothing")
    assert alive(pids.stepd) and alive(pids.worker)  # a worker outlives agent and zygote
    os.kill(pids.stepd.pid, signal.SIGTERM)
    until(lambda: not alive(pids.stepd), "end of the stepd")
    assert not alive(pids.worker)


def _children(pid: int) -> set[int]:
    """The live processes whose parent is `pid`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.add(int(entry.name))
    return found


def only_spare(zyg: Zygote, what: str) -> int:
    """The zygote's one child once it has exactly one: the spare it keeps waiting."""
    zygote_pid = zyg.pid
    assert zygote_pid is not None

    def one() -> int | None:
        children = _children(zygote_pid)
        return next(iter(children)) if len(children) == 1 else None

    return until(one, what)


def _gone(pid: int) -> bool:
    """Exited (a zombie until whoever inherited it reaps it) or reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True
