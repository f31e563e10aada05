"""Table tests of the one `--output` / `--error` rule (shared/outputs.py), which admission
and the launcher both run."""

from __future__ import annotations

from typing import Any

import pytest

from shared.jobspec import JobSpec
from shared.outputs import expand_pattern, output_paths

PATTERNS = {
    "every escape is filled in": (
        "logs/%x-%j-%A_%4a.%u.%N.%%.%q",
        (12, "train", "alice", "node01", 10, 7),
        "logs/train-12-10_0007.alice.node01.%.%q",
    ),
    "outside an array %A is the job id and %a Slurm's NO_VAL": (
        "%A_%a",
        (5, "n", "u"),
        "5_4294967294",
    ),
    "a width pads the job id too": ("out-%6j.log", (42, "n", "u"), "out-000042.log"),
    "%J is the job id and %s the batch step": ("%J.%s", (9, "n", "u"), "9.batch"),
    "a width does not pad text": ("%5x|%3u", (1, "ab", "cd"), "ab|cd"),
    "%% before a letter stays a percent": ("100%%j", (3, "n", "u"), "100%j"),
    "a trailing percent stays as written": ("odd%", (3, "n", "u"), "odd%"),
    "an unknown escape stays as written": ("%q%Z", (3, "n", "u"), "%q%Z"),
}


@pytest.mark.parametrize(("pattern", "args", "want"), PATTERNS.values(), ids=PATTERNS.keys())
def test_expand_pattern(pattern: str, args: tuple[Any, ...], want: str) -> None:
    assert expand_pattern(pattern, *args) == want


def spec(**kw: Any) -> JobSpec:
    return JobSpec(**({"user": "alice", "script": "train.sh", "name": "train"} | kw))


PATHS = {
    "no --output: slurm-<job>.out for both streams": (spec(), ("slurm-12.out", "slurm-12.out")),
    "an array task without --output: slurm-<array job>_<task>.out": (
        spec(array_job_id=10, array_task_id=3),
        ("slurm-10_3.out", "slurm-10_3.out"),
    ),
    "--output alone: stderr follows stdout": (
        spec(output="logs/%x-%j.%N.log"),
        ("logs/train-12.node01.log", "logs/train-12.node01.log"),
    ),
    "--error alone: stdout keeps the default": (
        spec(error="%j.err"),
        ("slurm-12.out", "12.err"),
    ),
    "both, with a padded array task": (
        spec(output="%A_%4a.out", error="%A_%4a.err", array_job_id=10, array_task_id=7),
        ("10_0007.out", "10_0007.err"),
    ),
}


@pytest.mark.parametrize(("job", "want"), PATHS.values(), ids=PATHS.keys())
def test_output_paths(job: JobSpec, want: tuple[str, str]) -> None:
    assert output_paths(job, 12, "node01") == want
