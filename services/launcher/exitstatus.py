"""Pure core: how a worker process ended, as data.

`ExitStatus` is built from what the kernel reports (a `waitpid` status or an asyncio
return code) plus the best-effort OOM verdict. What is detectable here, and what is not:

- A normal exit: its code (0-255). A shell that saw its child killed by signal N exits
  with 128+N; that stays an exit code, since only the shell knows.
- Death by a signal: the signal number. SIGKILL alone does not mean out of memory: the
  launcher's own `terminate` sends it too.
- Out of memory: when the worker's memory cgroup has a readable `oom_kill` counter
  (cgroup v2 `memory.events`, v1 `memory.oom_control`) that rose while the worker ran,
  and the worker failed. With the job's own cgroup (`cgroups.py`) the count is exactly
  the job's, so any OOM kill in it counts even when the script exited 0 (Slurm's rule),
  and its memory peak comes with it; without one (no usable cgroup on the
  node) the counter is the agent's, so an OOM kill of another process there during the
  run is blamed on this worker too. Kernel logs (dmesg) are not read.
"""

from __future__ import annotations

import os
import signal as _signal

import msgspec


class ExitStatus(msgspec.Struct, frozen=True, kw_only=True):
    """Exactly one of `exit_code` / `signal` is set for a process that ended."""

    exit_code: int | None = None
    signal: int | None = None
    oom_killed: bool = False
    mem_peak_bytes: int | None = None  # the job cgroup's memory peak, where known
    cpu_usec: int | None = None  # and the CPU time its processes used

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.oom_killed

    @property
    def signal_name(self) -> str | None:
        if self.signal is None:
            return None
        try:
            return _signal.Signals(self.signal).name
        except ValueError:
            return f"SIG{self.signal}"

    def slurm_exit_code(self) -> str:
        """Slurm's `ExitCode` column: `<exit code>:<signal>`."""
        return f"{self.exit_code or 0}:{self.signal or 0}"

    def describe(self) -> str:
        """A short human reason: `exit 0`, `exit 3`, `signal SIGKILL`, `out of memory`."""
        if self.oom_killed:
            if self.mem_peak_bytes is not None:
                return f"out of memory (peak {self.mem_peak_bytes / 2**20:.0f} MiB)"
            return "out of memory"
        if self.signal is not None:
            return f"signal {self.signal_name}"
        return f"exit {self.exit_code}"


def from_returncode(returncode: int, *, oom_killed: bool = False) -> ExitStatus:
    """From `Popen.returncode` / asyncio's: negative means killed by that signal."""
    if returncode < 0:
        return ExitStatus(signal=-returncode, oom_killed=oom_killed)
    return ExitStatus(exit_code=returncode, oom_killed=oom_killed)


def from_wait_status(status: int, *, oom_killed: bool = False) -> ExitStatus:
    """From a raw `os.waitpid` status word of a process that has ended."""
    if os.WIFSIGNALED(status):
        return ExitStatus(signal=os.WTERMSIG(status), oom_killed=oom_killed)
    if os.WIFEXITED(status):
        return ExitStatus(exit_code=os.WEXITSTATUS(status), oom_killed=oom_killed)
    raise ValueError(f"wait status {status:#x} is not of an ended process (stopped?)")


def parse_oom_kills(memory_events: str) -> int | None:
    """The `oom_kill` counter of a cgroup v2 `memory.events` or v1 `memory.oom_control`
    file's text, None if it has none."""
    for line in memory_events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value.strip())
    return None


def oom_verdict(status: ExitStatus, before: int | None, after: int | None) -> ExitStatus:
    """`status` with `oom_killed` set when the OOM-kill counter rose and it failed."""
    failed = status.signal is not None or status.exit_code != 0
    rose = before is not None and after is not None and after > before
    return msgspec.structs.replace(status, oom_killed=failed and rose)
