"""Shell: the node executor's process handling. Starts, signals, waits for and reaps
job workers, which are always real processes.

A worker is a process group: `spawn_worker` starts it as the leader of a new session,
so one `killpg` reaches the script, torchrun, its workers and anything they fork.
Descendants that leave the group themselves (`setsid`, daemons) escape it; given the
job's cgroup (`cgroups.py`, made by stepd), the worker is forked inside it and every
process in it is killed with the group, so nothing escapes, and its OOM verdict and
memory peak are the cgroup's own.

The output files and the working directory are opened by the worker itself, after it
has become the submitting user (a tiny `/bin/sh` prologue does it), so a job can never
write where its user may not. A failure of that prologue exits with `SETUP_FAILED`
(125), its reason in the error file when that file could be opened, else on the
agent's stderr. A program that cannot be executed exits 126 / 127 like in a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import posixpath
import pwd
import signal as _signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence

import msgspec

from services.launcher import cgroups
from services.launcher.exitstatus import (
    ExitStatus,
    from_returncode,
    oom_verdict,
    parse_oom_kills,
)

log = logging.getLogger(__name__)

SETUP_FAILED = 125
_POLL_S = 0.05
_STRAGGLER_WAIT_S = 5.0

# Runs as the job's user: truncate or append the output files, point stdout/stderr at
# them, enter the workdir, become the job's program (same pid, same group).
_PROLOGUE = r"""
o=$1 e=$2 od=$3 ed=$4 wd=$5 ap=$6 tp=$7; shift 7
mkdir -p -- "$od" "$ed" || exit 125
if [ "$ap" = 1 ]; then true >>"$o" && true >>"$e"; else true >"$o" && true >"$e"; fi || exit 125
exec >>"$o" 2>>"$e"
cd -- "$wd" || exit 125
if [ -n "$tp" ]; then
  out=$("$tp") || { echo "muster: TaskProlog $tp failed" >&2; exit 125; }
  nl='
'
  while IFS= read -r line; do
    case $line in
      "export "[A-Za-z_]*=*) kv=${line#export }; export "${kv%%=*}=${kv#*=}" ;;
      "unset "[A-Za-z_]*) unset "${line#unset }" ;;
      "print "*) printf '%s\n' "${line#print }" ;;
    esac
  done <<EOF_TP
$out$nl
EOF_TP
fi
exec "$@"
"""


class LaunchError(Exception):
    """A worker could not be started; the subclass says why, its fields say for whom."""


class UnknownUser(LaunchError):
    def __init__(self, user: str) -> None:
        self.user = user
        super().__init__(
            f"user {user!r} does not exist on this node: create the account here "
            "(or fix the directory service) or submit as an existing user"
        )


class RootNotAllowed(LaunchError):
    def __init__(self, user: str) -> None:
        self.user = user
        super().__init__(
            f"refusing to run a job as root (user {user!r}): submit as an ordinary user, "
            "or enable allow_root in the launcher settings"
        )


class CannotSwitchUser(LaunchError):
    def __init__(self, user: str, agent_uid: int) -> None:
        self.user = user
        self.agent_uid = agent_uid
        super().__init__(
            f"the agent runs as uid {agent_uid} and cannot start a job as {user!r}: "
            "run the agent as root to launch other users' jobs"
        )


class SpawnFailed(LaunchError):
    def __init__(self, argv0: str, reason: str) -> None:
        self.argv0 = argv0
        self.reason = reason
        super().__init__(f"could not start {argv0!r}: {reason}")


class RunAs(msgspec.Struct, frozen=True, kw_only=True):
    """The account a worker runs as: ids resolved on this node."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    home: str = "/"


def resolve_run_as(user: str, *, allow_root: bool = False) -> RunAs:
    """Look `user` up in this node's account database (passwd/group, NSS)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError as err:
        raise UnknownUser(user) from err
    if entry.pw_uid == 0 and not allow_root:
        raise RootNotAllowed(user)
    groups = tuple(sorted(set(os.getgrouplist(user, entry.pw_gid))))
    return RunAs(user=user, uid=entry.pw_uid, gid=entry.pw_gid, groups=groups, home=entry.pw_dir)


def free_port(host: str = "") -> int:
    """A TCP port free on this host right now, for MASTER_PORT / the rendezvous.

    The port is released before it is returned, so another process could take it
    first; the rendezvous then fails and the attempt is retried with a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


async def spawn_worker(
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: str,
    stdout_path: str,
    stderr_path: str,
    run_as: RunAs | None = None,
    *,
    allow_root: bool = False,
    append: bool = False,
    cgroup: cgroups.CgroupRef | None = None,
    hierarchy: cgroups.Hierarchy | None = None,
    task_prolog: str = "",
) -> Worker:
    """Start `argv` as a new process group, as `run_as` (default: the agent's user).

    Relative output paths are relative to `workdir`; the same path for both streams
    interleaves them in one file. `append` keeps what earlier attempts wrote. With
    `cgroup` (and the `hierarchy` this process is in) the worker is forked inside it.
    `task_prolog` (a site script) runs as the user first; its `export NAME=value`
    lines set the job's environment, as Slurm's TaskProlog. Raises a `LaunchError`
    when the worker may not or cannot start.
    """
    if not argv:
        raise SpawnFailed("", "empty command line")
    ids, env = _identity(run_as, env, allow_root=allow_root)
    out = posixpath.join(workdir, stdout_path)
    err = posixpath.join(workdir, stderr_path)
    wrapper = [
        "/bin/sh",
        "-c",
        _PROLOGUE,
        "muster-worker",
        out,
        err,
        posixpath.dirname(out) or "/",
        posixpath.dirname(err) or "/",
        workdir,
        "1" if append else "0",
        task_prolog,
        *argv,
    ]
    inside = cgroups.entered_if(cgroup, hierarchy)
    try:
        with inside:
            proc = _popen(wrapper, env, ids)
    except (OSError, cgroups.CgroupError) as error:
        raise SpawnFailed(argv[0], str(error)) from error
    log.debug("worker started", extra={"pid": proc.pid, "argv0": argv[0]})
    if cgroup is not None:
        return Worker(proc, oom_events=None, cgroup=cgroup)
    return Worker(proc, oom_events=_memory_events_path(proc.pid))


def _popen(wrapper: list[str], env: Mapping[str, str], ids: _Ids) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # fork+exec only; waiting is async
        wrapper,
        env=dict(env),
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        user=ids.uid,
        group=ids.gid,
        extra_groups=ids.groups,
    )


class _Ids(msgspec.Struct, frozen=True):
    uid: int | None = None
    gid: int | None = None
    groups: list[int] | None = None


def _identity(
    run_as: RunAs | None, env: Mapping[str, str], *, allow_root: bool
) -> tuple[_Ids, dict[str, str]]:
    """The ids to switch to (none: stay the agent's) and the env adjusted to them."""
    agent_uid = os.geteuid()
    if run_as is None:
        if agent_uid == 0 and not allow_root:
            raise RootNotAllowed("root")
        return _Ids(), dict(env)
    if run_as.uid == 0 and not allow_root:
        raise RootNotAllowed(run_as.user)
    if run_as.uid == agent_uid:
        return _Ids(), dict(env)
    if agent_uid != 0:
        raise CannotSwitchUser(run_as.user, agent_uid)
    adjusted = dict(env) | {"USER": run_as.user, "LOGNAME": run_as.user, "HOME": run_as.home}
    return _Ids(uid=run_as.uid, gid=run_as.gid, groups=list(run_as.groups)), adjusted


class Worker:
    """A started worker: its process group, until every member is gone."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        oom_events: str | None,
        cgroup: cgroups.CgroupRef | None = None,
    ) -> None:
        self._proc = proc
        self._oom_events = oom_events
        self._oom_before = _read_oom_kills(oom_events)
        self.cgroup = cgroup  # the job's own: OOM and peak are its, its procs are killed
        self._lock = asyncio.Lock()
        self._status: ExitStatus | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def pgid(self) -> int:
        """The process group (and session) id: the leader's pid."""
        return self._proc.pid

    @property
    def status(self) -> ExitStatus | None:
        """How it ended, once `wait` has seen it end."""
        return self._status

    def signal(self, sig: int, *, leader_only: bool = False) -> None:
        """Send `sig` to every process in the worker's group and cgroup (gone ones are
        fine), or to the job's script alone (`--signal=B:SIG`)."""
        if self._status is not None:
            return  # the group is gone and its id may be reused: never signal it again
        with contextlib.suppress(ProcessLookupError):
            if leader_only:
                if self._proc.returncode is None:
                    os.kill(self.pid, sig)
                return
            if self.cgroup is not None:  # what left the group; the group gets killpg
                cgroups.kill(self.cgroup, sig, but_group=self.pgid)
            os.killpg(self.pgid, sig)

    def _members(self) -> bool:
        if group_members(self.pgid):
            return True
        return self.cgroup is not None and bool(cgroups.procs(self.cgroup) - {os.getpid()})

    async def wait(self) -> ExitStatus:
        """Wait for the leader to end, then kill and reap what it left in its group.

        Like Slurm, a job's processes do not outlive its script: background processes
        still in the group when the leader exits are SIGKILLed.
        """
        async with self._lock:
            if self._status is None:
                returncode = await self._leader_exit()
                await self._kill_stragglers()
                self._status = self._verdict(from_returncode(returncode))
            return self._status

    def _verdict(self, status: ExitStatus) -> ExitStatus:
        if self.cgroup is None:
            return oom_verdict(status, self._oom_before, _read_oom_kills(self._oom_events))
        # The job's own count: any OOM kill in it makes it OUT_OF_MEMORY, as in Slurm,
        # even when its script went on and exited 0.
        memory = cgroups.outcome(self.cgroup)
        killed = (memory.oom_kills or 0) > 0
        return msgspec.structs.replace(
            status, oom_killed=killed, mem_peak_bytes=memory.peak_bytes, cpu_usec=memory.cpu_usec
        )

    async def terminate(self, grace_s: float = 30.0) -> ExitStatus:
        """SIGTERM to the group; SIGKILL to whatever is still there after `grace_s`."""
        self.signal(_signal.SIGTERM)
        if not await self._group_gone_within(grace_s):
            self.signal(_signal.SIGKILL)
        return await self.wait()

    async def _leader_exit(self) -> int:
        await process_gone(self.pid, lambda: self._proc.poll() is None)
        return self._proc.wait()

    async def _group_gone_within(self, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._proc.poll() is None or self._members():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True

    async def _kill_stragglers(self) -> None:
        if not self._members():
            return
        self.signal(_signal.SIGKILL)
        if not await self._group_gone_within(_STRAGGLER_WAIT_S):
            log.warning("process group survived SIGKILL", extra={"pgid": self.pgid})


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`, from /proc."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return _members_by_signal(pgid)
    members = []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as f:
                state, pgrp = parse_proc_stat(f.read())
        except (OSError, ValueError, IndexError):
            continue  # gone while we looked
        if pgrp == pgid and state not in ("Z", "X"):
            members.append(int(name))
    return members


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state, process group) of a `/proc/<pid>/stat` line; the name may hold ')'."""
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[2])


def _members_by_signal(pgid: int) -> list[int]:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pgid]


def _memory_events_path(pid: int) -> str | None:
    """The file holding the `oom_kill` counter of `pid`'s memory cgroup: cgroup v2's
    `memory.events` (unified or hybrid mount) or v1's `memory.oom_control`."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, rel = parts[1], parts[2].lstrip("/")
        if controllers == "":
            candidates += [
                posixpath.join("/sys/fs/cgroup", rel, "memory.events"),
                posixpath.join("/sys/fs/cgroup/unified", rel, "memory.events"),
            ]
        elif "memory" in controllers.split(","):
            candidates.append(posixpath.join("/sys/fs/cgroup/memory", rel, "memory.oom_control"))
    return next((c for c in candidates if os.path.exists(c)), None)


def _read_oom_kills(path: str | None) -> int | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return parse_oom_kills(f.read())
    except OSError:
        return None


async def process_gone(pid: int, running: Callable[[], bool]) -> None:
    """Until process `pid` has ended (`running` says whether it still is: a child's
    `poll`, which also reaps it, or a pid and start time check)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        pidfd = -1
    try:
        if pidfd >= 0 and running():
            loop = asyncio.get_running_loop()
            gone: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(pidfd, readable)
            try:
                await gone
            finally:
                loop.remove_reader(pidfd)
        while True:  # no pidfd (kernel < 5.3), or a spurious wake-up: poll
            if not running():
                return
            await asyncio.sleep(_POLL_S)
    finally:
        if pidfd >= 0:
            os.close(pidfd)
