"""Pure core: the site hooks around a job on a node (Slurm's Prolog, Epilog and
TaskProlog), as data: which environment a hook sees and what its ending means.

A hook sees the job as Slurm shows it (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`,
`CUDA_VISIBLE_DEVICES`, `SLURM_JOB_USER`, `SLURM_JOB_PARTITION`, ...), taken from the
job's own environment, plus a fixed `PATH`: never the rest of the job's environment nor
the agent's, so a job cannot steer a root hook with its variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

import msgspec

HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The job's variables a hook is given (when the job has them).
HOOK_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_USER",
    "SLURM_JOB_ACCOUNT",
    "SLURM_JOB_PARTITION",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NODEID",
    "SLURM_RESTART_COUNT",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "CUDA_VISIBLE_DEVICES",
    "SLURMD_NODENAME",
)


class Hook(StrEnum):
    PROLOG = "prolog"  # root, before the job's first process on the node
    EPILOG = "epilog"  # root, after its last process on the node
    TASK_PROLOG = "task_prolog"  # the user, just before the job's program


class HookResult(msgspec.Struct, frozen=True, kw_only=True):
    """How one hook run ended: its exit code, or killed at its timeout."""

    hook: Hook
    path: str
    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    output: str = ""  # the last lines it printed, for the drain reason

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def describe(self) -> str:
        """The reason a node is drained for: `prolog /x exited 3: <last line>`."""
        if self.timed_out:
            what = "timed out and was killed"
        elif self.signal is not None:
            what = f"was killed by signal {self.signal}"
        else:
            what = f"exited {self.exit_code}"
        last = self.output.strip().splitlines()[-1:] if self.output.strip() else []
        return f"{self.hook} {self.path} {what}" + (f": {last[0][:200]}" if last else "")


def hook_env(job_env: Mapping[str, str], node: str, hook: Hook) -> dict[str, str]:
    """The environment a hook runs with."""
    env = {k: job_env[k] for k in HOOK_VARIABLES if k in job_env}
    env.setdefault("SLURMD_NODENAME", node)
    env["PATH"] = HOOK_PATH
    env["MUSTER_HOOK"] = str(hook)
    if hook is Hook.TASK_PROLOG:
        env.pop("PATH")  # the job's own PATH applies: it runs in the job's environment
    return env


def tail(text: str, lines: int = 5) -> str:
    """The last `lines` lines of a hook's output."""
    return "\n".join(text.strip().splitlines()[-lines:])
