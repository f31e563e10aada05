"""The submitit plugin's pure parts: the batch script it writes and how it reads
`muster queue --json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("submitit", reason="the submitit extra (installed with dev)")

from muster.submitit_plugin import MusterExecutor, batch_script, read_queue


def sbatch_lines(text: str) -> list[str]:
    return [x.removeprefix("#SBATCH ") for x in text.splitlines() if x.startswith("#SBATCH")]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, ["--job-name=submitit", "--time=5", "--nodes=1"]),
        (
            {"partition": "gpu", "gpus_per_node": 8, "time": 90, "nodes": 2, "account": "ml"},
            ["--time=90", "--nodes=2", "--partition=gpu", "--account=ml", "--gpus-per-node=8"],
        ),
        ({"mem": "8G", "cpus_per_task": 4}, ["--cpus-per-task=4", "--mem=8G"]),
        ({"exclusive": True, "constraint": "h100&ib"}, ["--constraint=h100&ib", "--exclusive"]),
        ({"signal_delay_s": 120}, ["--signal=USR2@120"]),
        ({"map_count": 10, "array_parallelism": 3}, ["--array=0-9%3"]),
        ({"map_count": 2}, ["--array=0-1%2"]),
        (
            {"additional_parameters": {"begin": "now+60", "hold": True}},
            ["--begin=now+60", "--hold"],
        ),
    ],
)
def test_the_batch_script_carries_the_parameters(
    params: dict[str, object], expected: list[str], tmp_path: Path
) -> None:
    lines = sbatch_lines(batch_script("python -m x", tmp_path, params))
    for option in expected:
        assert option in lines, lines


def test_the_script_runs_the_command_per_task_with_submitit_log_names(tmp_path: Path) -> None:
    text = batch_script("PY -u -m submitit.core._submit FOLDER", tmp_path / "%j", {})
    assert "export SUBMITIT_EXECUTOR=muster" in text
    assert f"--output={tmp_path}/%j_batch.out" in sbatch_lines(text)
    assert 'exec PY -u -m submitit.core._submit FOLDER >>"$log.out" 2>>"$log.err"' in text
    array = batch_script("PY", tmp_path, {"map_count": 3})
    assert f"--output={tmp_path}/%A_%a_batch.out" in sbatch_lines(array)


def test_the_generic_parameters_map_to_muster_options(tmp_path: Path) -> None:
    ex = MusterExecutor(tmp_path)
    ex.update_parameters(**ex._convert_parameters({"timeout_min": 30, "mem_gb": 2, "name": "n"}))
    assert (ex.parameters["time"], ex.parameters["mem"], ex.parameters["job_name"]) == (
        30,
        "2048M",
        "n",
    )
    with pytest.raises(ValueError, match="Unavailable parameter"):
        ex.update_parameters(gpus=3)
    with pytest.raises(ValueError, match="one task per node"):
        ex.update_parameters(ntasks_per_node=4)


def row(job_id: int, state: str, **extra: object) -> dict[str, object]:
    return {"job_id": job_id, "state": state, "nodelist": ["node01"], "reason": "", **extra}


@pytest.mark.parametrize(
    ("rows", "key", "state"),
    [
        ([row(7, "RUNNING")], "7", "RUNNING"),
        ([row(7, "CONFIGURING")], "7", "PENDING"),
        ([row(7, "STARTING")], "7", "RUNNING"),
        ([row(7, "PREEMPTED")], "7", "CANCELLED"),  # ended: submitit must not wait on it
        ([row(7, "OUT_OF_MEMORY")], "7", "OUT_OF_MEMORY"),
        ([row(9, "COMPLETED", array_job_id=8, array_task_id=1)], "8_1", "COMPLETED"),
        ([row(9, "COMPLETED", array_job_id=8, array_task_id=1)], "9", "COMPLETED"),
    ],
)
def test_the_queue_is_read_with_slurm_state_names(
    rows: list[dict[str, object]], key: str, state: str
) -> None:
    info = read_queue(json.dumps({"jobs": rows}))
    assert info[key]["State"] == state
    assert read_queue(b"") == {}


def test_the_job_id_is_read_from_submit_json() -> None:
    assert MusterExecutor._get_job_id_from_submission_command('{"job_ids": [41, 42]}') == "41"
    from submitit.core.utils import FailedSubmissionError

    with pytest.raises(FailedSubmissionError, match="could not read a job id"):
        MusterExecutor._get_job_id_from_submission_command("Submitted batch job 41")
