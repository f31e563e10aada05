"""Pure: `--output` / `--error` filename patterns, expanded as sbatch does.

`%j` job id, `%x` job name, `%u` user, `%N` first node, `%A` array master job id,
`%a` array task id, `%J` job id (a batch script is step "batch"), `%%` a literal `%`.
A number between `%` and the letter zero-pads (`%4a` -> `0007`). Unknown escapes stay
as written. Outside an array, `%A` is the job id and `%a` is 4294967294, Slurm's NO_VAL.
"""

from __future__ import annotations

import re

NO_ARRAY_TASK = 4294967294
_ESCAPE = re.compile(r"%(\d{0,2})([%AaJjNuxs])")


def default_output(array: bool) -> str:
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
    values: dict[str, str | int] = {
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

    def one(m: re.Match[str]) -> str:
        width, letter = m.group(1), m.group(2)
        value = values[letter]
        if isinstance(value, int) and width:
            return str(value).zfill(int(width))
        return str(value)

    return _ESCAPE.sub(one, pattern)
