"""Shell: one cgroup per job worker on this node, under a muster root inside the
agent's own cgroup (what systemd delegates with `Delegate=yes`).

`create` makes the job's cgroup in every hierarchy it needs (v1: memory, cpu, cpuacct
where not mounted with cpu, pids, devices, blkio; v2: one folder) and writes the
limits `cgroups_core.plan` says; the step supervisor moves the worker in before it
execs (`entered`: stepd enters, forks, leaves);
`procs` / `kill` reach every process of the job however it daemonised; `outcome` reads
the OOM-kill counter, the memory peak and the CPU time used; `remove` kills what is
left and removes the folders. A `CgroupRef` is plain data, persisted in the worker
table, so a restarted agent can still find and kill a job's processes.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from services.launcher.cgroups_core import (
    V1_CONTROLLERS,
    V2_CONTROLLERS,
    DevNum,
    Limits,
    MemoryOutcome,
    Version,
    choose_version,
    cpu_usec,
    memory_outcome,
    parse_mounts,
    parse_proc_cgroup,
    plan,
)

log = logging.getLogger(__name__)
_KILL_WAIT_S = 10.0
AGENT_LEAF = "muster-agent"


class CgroupError(Exception):
    """A job cgroup could not be made as asked; `path` is the file or folder at fault."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cgroup {path}: {reason}")


class Hierarchy(msgspec.Struct, frozen=True, kw_only=True):
    """The cgroup layout this process sees: its version, where each hierarchy is
    mounted, and this process's own cgroup in each."""

    version: Version
    mounts: dict[str, str]
    own: dict[str, str]  # where this process is (and returns to after `entered`)
    base: dict[str, str] = {}  # where the muster root goes, when not `own`

    def base_of(self, controller: str) -> str:
        return self.base.get(controller) or self.own.get(controller, "/")


class CgroupRef(msgspec.Struct, frozen=True, kw_only=True):
    """One job's cgroup: {controller: folder} (v2: {"": folder})."""

    version: Version
    dirs: dict[str, str]
    missing: tuple[str, ...] = ()  # v1 controllers this node has not mounted

    def dir_of(self, controller: str) -> str | None:
        return self.dirs.get("" if self.version is Version.V2 else controller)


def detect(proc: str = "/proc/self") -> Hierarchy | None:
    """This node's cgroup layout, None when no memory controller can be used."""
    try:
        mounts = parse_mounts(Path(f"{proc}/mountinfo").read_text())
        own = parse_proc_cgroup(Path(f"{proc}/cgroup").read_text())
    except OSError:
        return None
    # The agent's v2 leaf (enter_agent_leaf): job cgroups go beside it, in its parent.
    leaf = own.get("", "").endswith("/" + AGENT_LEAF)
    base = {"": own[""].rsplit("/", 1)[0] or "/"} if leaf else {}
    offered: list[str] = []
    if "" in mounts:
        with contextlib.suppress(OSError):
            tree = _join(mounts[""], base.get("") or own.get("", "/"))
            offered = Path(tree, "cgroup.controllers").read_text().split()
    version = choose_version(mounts, offered)
    if version is None:
        return None
    return Hierarchy(version=version, mounts=mounts, own=own, base=base)


def enter_agent_leaf(h: Hierarchy | None) -> None:
    """On cgroup v2, move this process (the node agent) into a leaf of its own cgroup,
    `<own>/muster-agent`: v2 lets no cgroup with processes enable controllers for its
    children, so the delegated cgroup itself must be left empty for the job cgroups.
    v1 needs nothing; a failure is left to `create` to report."""
    if h is None or h.version is not Version.V2 or h.own.get("", "").endswith(AGENT_LEAF):
        return
    leaf = Path(_join(h.mounts[""], h.own.get("", "/")), AGENT_LEAF)
    try:
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as err:
        log.warning(
            "cannot enter the agent's cgroup leaf", extra={"leaf": str(leaf), "error": str(err)}
        )


def create(h: Hierarchy, root: str, name: str, limits: Limits, *, strict: bool = True) -> CgroupRef:
    """Make the job's cgroup `root/name` and set `limits`; on any failure nothing of it
    is left and `CgroupError` says what. Not `strict`: a limit whose v1 controller
    this node has not mounted is skipped with a warning instead."""
    ref = _make_dirs(h, root, name)
    try:
        for write in plan(limits, h.version):
            folder = ref.dir_of(write.controller)
            if folder is None:
                if write.optional:
                    continue
                if not strict:
                    log.warning("controller not mounted, limit skipped: %s", write.file)
                    continue
                raise CgroupError(write.controller, "controller not mounted on this node")
            _write(Path(folder, write.file), write.value, optional=write.optional)
    except BaseException:
        remove(ref)
        raise
    return ref


def _make_dirs(h: Hierarchy, root: str, name: str) -> CgroupRef:
    if h.version is Version.V2:
        base = _join(h.mounts[""], h.base_of(""))
        top = Path(base, root)
        _mkdir(top)
        _enable_v2(Path(base), top)
        job = top / name
        _mkdir_new(job)
        return CgroupRef(version=h.version, dirs={"": str(job)})
    dirs: dict[str, str] = {}
    missing = []
    for ctl in V1_CONTROLLERS:
        if ctl not in h.mounts:
            missing.append(ctl)
            continue
        if ctl == "cpuacct" and h.mounts[ctl] == h.mounts.get("cpu"):
            continue  # mounted with cpu (cpu,cpuacct): the job's cpu folder is the same
        job = Path(_join(h.mounts[ctl], h.base_of(ctl)), root, name)
        _mkdir(job.parent)
        _mkdir_new(job)
        dirs[ctl] = str(job)
    return CgroupRef(version=h.version, dirs=dirs, missing=tuple(missing))


def _enable_v2(base: Path, top: Path) -> None:
    """Controllers on for the muster root's children. The agent's own cgroup must
    have no processes of its own for that (the v2 'no internal processes' rule): run
    the agent in a delegated leaf (deploy/systemd/muster-node.service)."""
    want = " ".join(f"+{c}" for c in V2_CONTROLLERS)
    for folder in (base, top):
        try:
            Path(folder, "cgroup.subtree_control").write_text(want)
        except OSError as err:
            raise CgroupError(
                str(folder),
                f"cannot enable {want}: {err.strerror}; delegate the agent's cgroup "
                "(systemd Delegate=yes) and start it in a leaf of it",
            ) from err


def entered_if(
    ref: CgroupRef | None, h: Hierarchy | None
) -> contextlib.AbstractContextManager[None]:
    """`entered(ref, h)` when both are known, else a block that changes nothing."""
    if ref is None or h is None:
        return contextlib.nullcontext()
    return entered(ref, h)


@contextlib.contextmanager
def entered(ref: CgroupRef, h: Hierarchy) -> Iterator[None]:
    """The calling thread inside `ref` for the block, then back where it was: a child
    it forks inside starts in the job's cgroup, before it execs anything.

    v1 moves this thread alone ("0" to `tasks`): the kernel skips its global
    threadgroup lock for a single thread moving itself, where a whole process's move
    (`cgroup.procs`) first waits out an RCU grace period, 5-17 ms after an idle spell
    on every start. v2 has no such file outside threaded subtrees: the whole process
    moves."""
    v1 = ref.version is Version.V1
    members, me = ("tasks", "0") if v1 else ("cgroup.procs", str(os.getpid()))
    try:
        for folder in ref.dirs.values():
            _write(Path(folder, members), me)
        yield
    finally:  # also after a partial entry: nothing of this process stays behind
        for ctl in ref.dirs:
            back = _join(h.mounts[ctl], h.own.get(ctl, "/"))
            with contextlib.suppress(OSError):
                Path(back, members).write_text(me)


def procs(ref: CgroupRef) -> set[int]:
    """Every process in the job's cgroup and the cgroups below it (a container's, which
    podman makes under the worker's), any hierarchy, gone ones excluded."""
    found: set[int] = set()
    for folder in ref.dirs.values():
        for below in _tree(folder):
            with contextlib.suppress(OSError):
                found |= {int(p) for p in Path(below, "cgroup.procs").read_text().split()}
    return found


def _tree(folder: str) -> list[str]:
    """`folder` and every cgroup folder under it, deepest first (the order to remove)."""
    out = [root for root, _, _ in os.walk(folder)]
    return sorted(out, key=lambda f: f.count("/"), reverse=True)


def kill(ref: CgroupRef, sig: int, *, but_group: int | None = None) -> int:
    """Send `sig` to every process of the job, except those of process group
    `but_group` (the caller signals that group itself, and a process signalled twice
    runs its handler twice: a script's TERM trap, killing the command the first one
    ran); how many were signalled."""
    hit = 0
    for pid in procs(ref):
        with contextlib.suppress(ProcessLookupError):
            if but_group is not None and os.getpgid(pid) == but_group:
                continue
            os.kill(pid, sig)
            hit += 1
    return hit


def outcome(ref: CgroupRef) -> MemoryOutcome:
    """The job's OOM-kill count, memory peak and CPU time, as the kernel counted them."""
    folder = ref.dir_of("memory")
    if folder is None:
        return MemoryOutcome()
    if ref.version is Version.V2:
        got = memory_outcome(
            ref.version, _read(folder, "memory.events"), _read(folder, "memory.peak")
        )
        used = cpu_usec(ref.version, _read(folder, "cpu.stat"))
    else:
        got = memory_outcome(
            ref.version,
            _read(folder, "memory.oom_control"),
            _read(folder, "memory.max_usage_in_bytes"),
        )
        acct = ref.dir_of("cpuacct") or ref.dir_of("cpu")  # co-mounted: cpu's folder
        used = None if acct is None else cpu_usec(ref.version, _read(acct, "cpuacct.usage"))
    return msgspec.structs.replace(got, cpu_usec=used)


def remove(ref: CgroupRef, wait_s: float = _KILL_WAIT_S) -> bool:
    """SIGKILL what is left in the job's cgroup, then remove its folders; False when a
    folder stayed (a process in uninterruptible sleep): the next removal retries."""
    deadline = time.monotonic() + wait_s
    while kill(ref, 9) and time.monotonic() < deadline:
        time.sleep(0.02)
    gone = True
    for top in ref.dirs.values():
        for folder in _tree(top):  # a container's cgroup under it goes first
            for _ in range(50):  # a killed process leaves its cgroup a moment after it died
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                log.warning("cgroup not removed", extra={"cgroup": folder})
                gone = False
    return gone


def gpu_devices(template: str) -> dict[int, DevNum]:
    """This node's GPU device nodes: `template` with `{index}` (e.g. /dev/nvidia{index})
    globbed; each character device found, by index."""
    if "{index}" not in template:
        return {}
    head, _, tail = template.partition("{index}")
    pattern = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")
    found: dict[int, DevNum] = {}
    for path in glob.glob(glob.escape(head) + "[0-9]*" + glob.escape(tail)):
        match = pattern.match(path)
        dev = device_number(path, block=False)
        if match and dev is not None:
            found[int(match.group(1))] = dev
    return found


def device_number(path: str, *, block: bool) -> DevNum | None:
    """The device number of a character (or `block`) device node; None otherwise."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    kind = stat.S_ISBLK(st.st_mode) if block else stat.S_ISCHR(st.st_mode)
    return DevNum(major=os.major(st.st_rdev), minor=os.minor(st.st_rdev)) if kind else None


def _join(mount: str, rel: str) -> str:
    return str(Path(mount) / rel.lstrip("/"))


def _mkdir_new(path: Path) -> None:
    """A job's cgroup is its own: one left by an earlier run of the same name (a
    crashed agent) is removed first if empty; one still holding processes is refused."""
    with contextlib.suppress(FileNotFoundError, OSError):
        path.rmdir()
    try:
        path.mkdir()
    except FileExistsError as err:
        raise CgroupError(str(path), "exists and still holds processes") from err
    except OSError as err:
        raise CgroupError(str(path), f"cannot create: {err.strerror}") from err


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as err:
        raise CgroupError(str(path), f"cannot create: {err.strerror}") from err


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    # Opened without O_CREAT: a control file this kernel lacks is absent (ENOENT), not a
    # file to create, which cgroupfs refuses with EACCES (a v1 blkio without bfq).
    try:
        fd = os.open(path, os.O_WRONLY)
        with os.fdopen(fd, "w") as f:
            f.write(value)
    except FileNotFoundError:
        if optional:
            log.info("cgroup file absent, skipped", extra={"file": str(path)})
            return
        raise CgroupError(str(path), "no such control file on this kernel") from None
    except OSError as err:
        raise CgroupError(str(path), f"cannot write {value!r}: {err.strerror}") from err


def _read(folder: str, name: str) -> str:
    try:
        return Path(folder, name).read_text()
    except OSError:
        return ""
