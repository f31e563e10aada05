"""Client: srun's `--output` / `--error` inside a job (docs/steps.md).

srun follows its tasks' output from the step's folder (`<procid>.out`, `.err`); with
`-o PATTERN` it writes stdout there instead of to its own, as Slurm's srun does, and
stderr too unless `-e PATTERN` names another. Patterns are Slurm's
(`shared/outputs.expand_step_pattern`: `%j %J %s %t %n %N %x %u %A %a %%`), relative to
srun's working directory: `%t` makes a file per task, `%n`/`%N` one per node, and
tasks whose paths come out the same share one file, their lines as srun reads them
(`-l` labels them). The files are made as the step is, empty for a task that prints
nothing, truncated unless `--open-mode=append`. A file srun cannot open is said once and
that output goes to srun's own stream instead: nothing a task prints is lost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import BinaryIO, Literal

import msgspec

from shared.api import StepReply
from shared.outputs import expand_step_pattern


class JobNames(msgspec.Struct, frozen=True, kw_only=True):
    """What a pattern may name of the job, from srun's environment (the job's)."""

    job_id: int
    name: str = ""
    user: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None

    @classmethod
    def of(cls, job_id: int, env: Mapping[str, str], user: str) -> JobNames:
        def number(key: str) -> int | None:
            value = env.get(key, "")
            return int(value) if value.isdigit() else None

        return cls(
            job_id=job_id,
            name=env.get("SLURM_JOB_NAME", ""),
            user=user,
            array_job_id=number("SLURM_ARRAY_JOB_ID"),
            array_task_id=number("SLURM_ARRAY_TASK_ID"),
        )


def task_nodes(reply: StepReply) -> list[tuple[str, int]]:
    """Each task's node and that node's index in the step, by rank: ranks in blocks,
    as the launcher lays them out (an older launcher's reply gives no counts: the
    blocks are then even, the first nodes taking one more)."""
    counts = list(reply.tasks_per_node)
    if len(counts) != len(reply.nodes):
        base, extra = divmod(reply.ntasks, max(len(reply.nodes), 1))
        counts = [base + (1 if i < extra else 0) for i in range(len(reply.nodes))]
    return [
        (node, i)
        for i, (node, n) in enumerate(zip(reply.nodes, counts, strict=True))
        for _ in range(n)
    ]


def paths(output: str, error: str, reply: StepReply, job: JobNames, cwd: str) -> dict[str, str]:
    """The file each of the step's streams goes to ("3.out" -> path); streams srun
    keeps for itself are absent (no `-o`: stdout; neither `-o` nor `-e`: stderr)."""
    out: dict[str, str] = {}
    for procid, (node, nodeid) in enumerate(task_nodes(reply)):
        for stream, pattern in (("out", output), ("err", error or output)):
            if not pattern:
                continue
            path = expand_step_pattern(
                pattern,
                job_id=job.job_id,
                step_id=reply.step_id,
                procid=procid,
                node=node,
                nodeid=nodeid,
                name=job.name,
                user=job.user,
                array_job_id=job.array_job_id,
                array_task_id=job.array_task_id,
            )
            out[f"{procid}.{stream}"] = os.path.join(cwd, path)
    return out


class Routes:
    """Where the follower writes each stream: a file of the patterns, or srun's own."""

    def __init__(self, output: str = "", error: str = "", append: bool = False) -> None:
        self.output = output
        self.error = error
        self.append = append
        self.ready = not (output or error)  # with patterns: once the step is made
        self._streams: dict[str, BinaryIO] = {}
        self._files: dict[str, BinaryIO] = {}  # by path: tasks whose paths match share one

    def open(self, reply: StepReply, job: JobNames, cwd: str) -> None:
        """The step is made: every file of its tasks, opened (made) now."""
        if self.ready:
            return
        mode: Literal["ab", "wb"] = "ab" if self.append else "wb"
        failed: set[str] = set()
        for name, path in paths(self.output, self.error, reply, job, cwd).items():
            f = self._files.get(path)
            if f is None and path not in failed:
                try:
                    f = self._files[path] = open(path, mode)  # noqa: SIM115 (kept open)
                except OSError as err:
                    failed.add(path)
                    print(
                        f"srun: error: cannot open {path}: {err.strerror}; "
                        "what goes there is written here instead",
                        file=sys.stderr,
                    )
            if f is not None:
                self._streams[name] = f
        self.ready = True  # last: the follower, in another thread, reads streams after

    def stream(self, name: str) -> BinaryIO:
        got = self._streams.get(name)
        if got is not None:
            return got
        return sys.stdout.buffer if name.endswith(".out") else sys.stderr.buffer

    def flush(self) -> None:
        for f in self._files.values():
            f.flush()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        self._streams.clear()
