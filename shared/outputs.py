"""Pure: the one `--output` / `--error` rule, as sbatch applies it. Admission and the
launcher both import it, so the path a job writes is the path the docs promise.

`%j` job id, `%x` job name, `%u` user, `%N` first node, `%A` array master job id,
`%a` array task id, `%J` job id (a batch script is step "batch"), `%s` `batch`,
`%%` a literal `%`. A number between `%` and the letter zero-pads (`%4a` -> `0007`).
Unknown escapes stay as written. Outside an array, `%A` is the job id and `%a` is
4294967294, Slurm's NO_VAL. Without `--output`: `slurm-%j.out` (`slurm-%A_%a.out` for
an array task); without `--error`, stderr goes where stdout goes.

srun's `--output` / `--error` inside a job (`expand_step_pattern`) know a step and its
tasks too, as Slurm's srun does: `%s` the step id, `%J` `jobid.stepid`, `%t` the task's
rank (a file per task), `%n` its node's index in the step and `%N` that node (a file
per node); a pattern with none of those is one file for every task.
"""

from __future__ import annotations

import re

from shared.jobspec import JobSpec

NO_ARRAY_TASK = 4294967294
_ESCAPE = re.compile(r"%(\d{0,2})([%AaJjNuxs])")
_STEP_ESCAPE = re.compile(r"%(\d{0,2})([%AaJjNnstux])")


def default_output(array: bool) -> str:
    """sbatch's default output file name."""
    return "slurm-%A_%a.out" if array else "slurm-%j.out"


def expand_pattern(
    pattern: str,
    job_id: int,
    name: str,
    user: str,
    node: str = "",
    array_job_id: int | None = None,
    array_task_id: int | None = None,
) -> str:
    """`pattern` with every escape filled in."""
    values = _job_values(job_id, name, user, node, array_job_id, array_task_id)
    return _fill(_ESCAPE, pattern, values)


def expand_step_pattern(
    pattern: str,
    *,
    job_id: int,
    step_id: int,
    procid: int,
    node: str,
    nodeid: int,
    name: str,
    user: str,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
) -> str:
    """srun's `pattern` for task `procid` of step `step_id`, on `node` (the step's
    `nodeid`-th)."""
    values = _job_values(job_id, name, user, node, array_job_id, array_task_id) | {
        "J": f"{job_id}.{step_id}",
        "s": step_id,
        "t": procid,
        "n": nodeid,
    }
    return _fill(_STEP_ESCAPE, pattern, values)


def _job_values(
    job_id: int,
    name: str,
    user: str,
    node: str,
    array_job_id: int | None,
    array_task_id: int | None,
) -> dict[str, str | int]:
    """The escapes a batch script's pattern fills (a step's adds its own over them)."""
    return {
        "%": "%",
        "j": job_id,
        "J": job_id,
        "x": name,
        "u": user,
        "N": node,
        "A": array_job_id if array_job_id is not None else job_id,
        "a": array_task_id if array_task_id is not None else NO_ARRAY_TASK,
        "s": "batch",
    }


def _fill(escape: re.Pattern[str], pattern: str, values: dict[str, str | int]) -> str:
    def one(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        value = values[letter]
        if isinstance(value, int) and width:
            return str(value).zfill(int(width))
        return str(value)

    return escape.sub(one, pattern)


def output_paths(spec: JobSpec, job_id: int, node: str) -> tuple[str, str]:
    """The (stdout, stderr) paths of `job_id`'s worker on `node`, expanded."""
    out = spec.output or default_output(spec.array_task_id is not None)
    err = spec.error or out

    def expand(pattern: str) -> str:
        return expand_pattern(
            pattern, job_id, spec.name, spec.user, node, spec.array_job_id, spec.array_task_id
        )

    return expand(out), expand(err)
