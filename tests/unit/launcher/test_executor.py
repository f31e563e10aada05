"""The node executor against real processes (services/launcher/executor.py).

Each test starts real workers through `spawn_worker` and checks the files, signals and
process groups the kernel reports; nothing is faked. Run-as-user tests need root (to
create a test account and switch to it) and are skipped, with the reason, otherwise.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from services.launcher.executor import (
    SETUP_FAILED,
    CannotSwitchUser,
    RootNotAllowed,
    RunAs,
    UnknownUser,
    Worker,
    free_port,
    group_members,
    resolve_run_as,
    spawn_worker,
)
from services.launcher.exitstatus import ExitStatus
from tests.support.accounts import Account, AccountUnavailable, run_as_account

ROOT = os.geteuid() == 0
FORKER = str(Path(__file__).resolve().parents[3] / "examples" / "forker.sh")
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


async def sh(tmp: Path, script: str, *, append: bool = False) -> Worker:
    return await spawn_worker(
        ["/bin/sh", "-c", script],
        ENV,
        str(tmp),
        "out.txt",
        "err.txt",
        allow_root=True,
        append=append,
    )


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def wait_for_line(path: Path, text: str, timeout_s: float = 10.0, count: int = 1) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = read(path)
        if content.count(text) >= count:
            return content
        await asyncio.sleep(0.02)
    raise AssertionError(f"{text!r} never appeared in {path}")


def alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie awaiting its reaper does not)."""
    left = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            left.append(pid)
    return left


async def test_output_goes_to_files_relative_to_the_workdir(tmp_path: Path) -> None:
    w = await spawn_worker(
        ["/bin/sh", "-c", "pwd; echo oops >&2; exit 3"], ENV, str(tmp_path),
        "logs/job.out", "logs/job.err", allow_root=True,
    )  # fmt: skip
    assert await w.wait() == ExitStatus(exit_code=3)
    assert (tmp_path / "logs/job.out").read_text() == f"{tmp_path}\n"
    assert (tmp_path / "logs/job.err").read_text() == "oops\n"


async def test_one_path_for_both_streams_interleaves_them(tmp_path: Path) -> None:
    w = await spawn_worker(
        ["/bin/sh", "-c", "echo a; echo b >&2; echo c"], ENV, str(tmp_path),
        str(tmp_path / "all.log"), str(tmp_path / "all.log"), allow_root=True,
    )  # fmt: skip
    assert (await w.wait()).ok
    assert (tmp_path / "all.log").read_text() == "a\nb\nc\n"


async def test_append_keeps_what_earlier_attempts_wrote(tmp_path: Path) -> None:
    await (await sh(tmp_path, "echo first")).wait()
    await (await sh(tmp_path, "echo second", append=True)).wait()
    await (await sh(tmp_path, "echo third", append=True)).wait()
    assert (tmp_path / "out.txt").read_text() == "first\nsecond\nthird\n"
    await (await sh(tmp_path, "echo fresh")).wait()
    assert (tmp_path / "out.txt").read_text() == "fresh\n"


async def test_a_missing_program_exits_127_with_the_reason_in_the_error_file(
    tmp_path: Path,
) -> None:
    w = await spawn_worker(["no-such-program-xyz"], ENV, str(tmp_path), "o", "e", allow_root=True)
    assert await w.wait() == ExitStatus(exit_code=127)
    assert "no-such-program-xyz" in (tmp_path / "e").read_text()


async def test_a_missing_workdir_is_a_setup_failure(tmp_path: Path) -> None:
    w = await spawn_worker(
        ["true"], ENV, str(tmp_path / "gone"), str(tmp_path / "o"), str(tmp_path / "e"),
        allow_root=True,
    )  # fmt: skip
    assert await w.wait() == ExitStatus(exit_code=SETUP_FAILED)
    assert "gone" in (tmp_path / "e").read_text()


async def test_terminate_reaps_children_and_grandchildren(tmp_path: Path) -> None:
    w = await spawn_worker([FORKER, "3"], ENV, str(tmp_path), "out.txt", "out.txt", allow_root=True)
    await wait_for_line(tmp_path / "out.txt", "ready")
    await wait_for_line(tmp_path / "out.txt", "grandchild", count=3)
    tree = group_members(w.pgid)
    assert len(tree) == 7  # forker + 3 subshells + 3 sleeping grandchildren
    status = await w.terminate(grace_s=5.0)
    assert status == ExitStatus(signal=signal.SIGTERM)
    assert alive(tree) == []
    assert group_members(w.pgid) == []


async def test_terminate_while_another_task_waits_ends_both_with_one_status(
    tmp_path: Path,
) -> None:
    w = await sh(tmp_path, "echo up; sleep 60")
    await wait_for_line(tmp_path / "out.txt", "up")
    waiter = asyncio.create_task(w.wait())
    assert await w.terminate(grace_s=5.0) == ExitStatus(signal=signal.SIGTERM)
    assert await waiter == ExitStatus(signal=signal.SIGTERM)
    assert await w.terminate(grace_s=5.0) == ExitStatus(signal=signal.SIGTERM)  # idempotent


async def test_terminate_sends_sigkill_after_the_grace_to_what_ignores_sigterm(
    tmp_path: Path,
) -> None:
    w = await spawn_worker(
        [FORKER, "2", "--stubborn"], ENV, str(tmp_path), "out.txt", "out.txt", allow_root=True
    )
    await wait_for_line(tmp_path / "out.txt", "ready")
    tree = group_members(w.pgid)
    started = time.monotonic()
    status = await w.terminate(grace_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert status == ExitStatus(signal=signal.SIGKILL)
    assert alive(tree) == []


async def test_a_worker_that_handles_sigterm_ends_within_the_grace(tmp_path: Path) -> None:
    # "up" once the sleep is forked: a TERM that came while the shell was still forking
    # it was handled only after the grace's SIGKILL ended the sleep (CI, once: 10 s).
    w = await sh(tmp_path, "trap 'echo got TERM; exit 0' TERM; sleep 60 & echo up; wait")
    await wait_for_line(tmp_path / "out.txt", "up")
    started = time.monotonic()
    assert await w.terminate(grace_s=10.0) == ExitStatus(exit_code=0)
    assert time.monotonic() - started < 5.0
    assert "got TERM" in (tmp_path / "out.txt").read_text()


async def test_signal_reaches_the_whole_group(tmp_path: Path) -> None:
    w = await sh(tmp_path, "trap 'echo usr1; exit 4' USR1; echo up; while :; do sleep 0.05; done")
    await wait_for_line(tmp_path / "out.txt", "up")
    w.signal(signal.SIGUSR1)
    assert await w.wait() == ExitStatus(exit_code=4)
    w.signal(signal.SIGUSR1)  # a gone group is not an error


async def test_a_leader_only_signal_reaches_the_script_but_not_its_children(
    tmp_path: Path,
) -> None:
    w = await sh(
        tmp_path,
        "trap 'echo leader; exit 0' USR1; "
        "( trap 'echo child' USR1; echo up; while :; do sleep 0.05; done ) & wait",
    )
    await wait_for_line(tmp_path / "out.txt", "up")
    w.signal(signal.SIGUSR1, leader_only=True)
    assert await w.wait() == ExitStatus(exit_code=0)
    assert read(tmp_path / "out.txt") == "up\nleader\n"


async def test_what_the_script_leaves_behind_is_killed_when_it_exits(tmp_path: Path) -> None:
    w = await sh(tmp_path, "sleep 300 & echo $!")
    status = await w.wait()
    leftover = int((tmp_path / "out.txt").read_text())
    assert status == ExitStatus(exit_code=0)
    assert alive([leftover]) == []


def test_the_executor_runs_under_uvloop(tmp_path: Path) -> None:
    async def run() -> tuple[ExitStatus, ExitStatus]:
        done = await (await sh(tmp_path, "exit 5")).wait()
        w = await sh(tmp_path, "sleep 60")
        return done, await w.terminate(1.0)

    assert uvloop.run(run()) == (ExitStatus(exit_code=5), ExitStatus(signal=signal.SIGTERM))


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("", port))
    assert 0 < port < 65536


def test_an_unknown_user_is_a_clear_error() -> None:
    with pytest.raises(UnknownUser, match="does not exist on this node") as err:
        resolve_run_as("no-such-user-xyz")
    assert err.value.user == "no-such-user-xyz"


def test_root_is_refused_unless_allowed() -> None:
    with pytest.raises(RootNotAllowed, match="allow_root"):
        resolve_run_as("root")
    assert resolve_run_as("root", allow_root=True).uid == 0


@pytest.mark.skipif(not ROOT, reason="the agent's own user is root only when tests run as root")
async def test_an_agent_running_as_root_refuses_to_run_a_job_as_itself(tmp_path: Path) -> None:
    with pytest.raises(RootNotAllowed):
        await spawn_worker(["true"], ENV, str(tmp_path), "o", "e")
    root = resolve_run_as("root", allow_root=True)
    with pytest.raises(RootNotAllowed):
        await spawn_worker(["true"], ENV, str(tmp_path), "o", "e", root)


@pytest.mark.skipif(ROOT, reason="switching users is allowed when the tests run as root")
async def test_an_unprivileged_agent_cannot_switch_users(tmp_path: Path) -> None:
    other = RunAs(user="someone", uid=os.geteuid() + 1, gid=os.getegid())
    with pytest.raises(CannotSwitchUser):
        await spawn_worker(["true"], ENV, str(tmp_path), "o", "e", other)


@pytest.fixture(scope="session")
def job_account() -> Account:
    try:
        return run_as_account()
    except AccountUnavailable as why:
        pytest.skip(str(why))


@pytest.fixture(scope="session")
def job_user(job_account: Account) -> RunAs:
    return resolve_run_as(job_account.name)


@pytest.fixture
def shared_dir(job_user: RunAs) -> Iterator[Path]:
    """A workdir the job's user can enter (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="muster-runas-"))
    os.chown(path, job_user.uid, job_user.gid)
    yield path
    shutil.rmtree(path)


async def test_a_job_runs_as_its_user_with_the_users_groups(
    job_account: Account, job_user: RunAs, shared_dir: Path
) -> None:
    w = await spawn_worker(
        ["/bin/sh", "-c", 'id -u; id -g; echo "$USER $HOME"'], ENV, str(shared_dir),
        "out.txt", "err.txt", job_user,
    )  # fmt: skip
    assert (await w.wait()).ok
    out = shared_dir / "out.txt"
    assert out.read_text().split("\n")[:3] == [
        str(job_user.uid), str(job_user.gid), f"{job_account.name} {job_account.home}",
    ]  # fmt: skip
    assert (out.stat().st_uid, out.stat().st_gid) == (job_user.uid, job_user.gid)


async def test_a_job_cannot_write_its_output_where_its_user_may_not(
    job_user: RunAs, shared_dir: Path, tmp_path: Path
) -> None:
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    w = await spawn_worker(
        ["true"], ENV, str(shared_dir), str(root_only / "o"), str(root_only / "e"), job_user
    )
    assert await w.wait() == ExitStatus(exit_code=SETUP_FAILED)
    assert list(root_only.iterdir()) == []
