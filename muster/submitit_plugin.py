"""submitit on Muster: `submitit.AutoExecutor(folder, cluster="muster")`.

Registered through submitit's own plugin entry points (`[project.entry-points.submitit]`
in pyproject.toml), so nothing in submitit is patched. The shape is submitit's Slurm
plugin, with `muster` commands where it runs `sbatch`, `sacct` and `scancel`:

- A submission is a batch script with `#SBATCH` lines made from the executor's
  parameters, submitted with `muster submit --json`; `map_array` submits one array
  (`--array=0-N%K`), whose tasks submitit names `ARRAY_TASK` as Slurm does.
- `job.state` and `job.done()` read `muster queue -a --json` (one call for every job
  being watched, as submitit batches `sacct`), Muster's states given Slurm's names.
- `job.cancel()` is `muster cancel`.
- In the job, Muster's SIGTERM before a preemption's or a fault's SIGKILL is when a
  checkpointable function's `checkpoint()` is called and the new submission pickled;
  Muster requeues the job itself (same id, `restart_count + 1`) and the next attempt
  starts from that pickle. `signal_delay_s` asks for USR2 that long before the time
  limit (`--signal=USR2@N`): the function checkpoints, but Muster does not requeue a
  job at its time limit, so the job ends TIMEOUT with its checkpoint on disk.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import typing as tp
from pathlib import Path
from types import FrameType

from submitit.core import core, job_environment, utils
from submitit.core.job_environment import SignalHandler

# Muster's states as submitit reads Slurm's: not in submitit's "incomplete" list means
# done. A job that ended PREEMPTED (a partition whose preempt mode cancels) is over, so
# it reads as CANCELLED; every other name is Slurm's own.
_STATES = {
    "CONFIGURING": "PENDING",
    "STARTING": "RUNNING",
    "PREEMPTED": "CANCELLED",
}


def _muster(*words: str) -> list[str]:
    """The command line of one `muster` CLI call, from this interpreter."""
    return [sys.executable, "-m", "muster.cli", *words]


def job_key(row: dict[str, tp.Any]) -> str:
    """How submitit names the job of one `muster queue --json` row: `ARRAY_TASK` for an
    array task, the job id otherwise."""
    if row.get("array_job_id") is not None and row.get("array_task_id") is not None:
        return f"{row['array_job_id']}_{row['array_task_id']}"
    return str(row["job_id"])


def read_queue(text: str | bytes) -> dict[str, dict[str, str]]:
    """`muster queue -a --json` output -> {submitit job id: {"State", "NodeList"}}."""
    rows = json.loads(text or b'{"jobs": []}')["jobs"]
    info: dict[str, dict[str, str]] = {}
    for row in rows:
        state = str(row["state"])
        entry = {
            "JobID": job_key(row),
            "State": _STATES.get(state, state),
            "NodeList": ",".join(row.get("nodelist") or ()),
            "Reason": str(row.get("reason") or ""),
        }
        info[job_key(row)] = entry
        info[str(row["job_id"])] = entry
    return info


class MusterInfoWatcher(core.InfoWatcher):
    def _make_command(self) -> list[str] | None:
        to_check = sorted({x.split("_")[0] for x in self._registered - self._finished})
        if not to_check:
            return None
        words = ["queue", "-a", "--json"]
        for job_id in to_check:
            words += ["-j", job_id]
        return _muster(*words)

    def get_state(self, job_id: str, mode: str = "standard") -> str:
        info = self.get_info(job_id, mode=mode)
        return info.get("State") or "UNKNOWN"

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        return read_queue(string)


class MusterJob(core.Job[core.R]):
    watcher = MusterInfoWatcher(delay_s=60)

    def cancel(self, check: bool = True) -> None:
        run = subprocess.check_call if check else subprocess.call
        run(_muster("cancel", self.job_id), shell=False)


class MusterJobEnvironment(job_environment.JobEnvironment):
    """Inside a Muster job: the `SLURM_*` set Muster gives every worker."""

    _env: tp.ClassVar[dict[str, str]] = {
        "job_id": "SLURM_JOB_ID",
        "num_tasks": "SLURM_NTASKS",
        "num_nodes": "SLURM_JOB_NUM_NODES",
        "node": "SLURM_NODEID",
        "nodes": "SLURM_JOB_NODELIST",
        "global_rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "array_job_id": "SLURM_ARRAY_JOB_ID",
        "array_task_id": "SLURM_ARRAY_TASK_ID",
    }

    @property
    def hostnames(self) -> list[str]:
        nodes = os.environ.get("MUSTER_NODES", "")
        return nodes.split(",") if nodes else [self.hostname]

    def _handle_signals(self, paths: utils.JobPaths, submission: utils.DelayedSubmission) -> None:
        handler = SignalHandler(self, paths, submission)
        signal.signal(signal.SIGTERM, _checkpoint_on_stop(handler, paths, submission))
        signal.signal(signal.SIGCONT, handler.bypass)
        signal.signal(self._usr_sig(), handler.checkpoint_and_try_requeue)

    def _requeue(self, countdown: int) -> None:
        """Muster requeues a preempted or faulted job itself; at the time limit it does
        not, and says so in the job's log."""
        print(
            f"muster: checkpoint written ({countdown} timeouts left); Muster does not"
            " requeue a job at its time limit, submit it again to resume",
            file=sys.stderr,
        )


def _checkpoint_on_stop(
    handler: SignalHandler, paths: utils.JobPaths, submission: utils.DelayedSubmission
) -> tp.Callable[[int, FrameType | None], None]:
    """SIGTERM: Muster stops the job (preemption, a fault, a cancel, the limit). Rank 0
    of a checkpointable function checkpoints, then the task exits; a requeued job's next
    attempt loads the pickle written here."""

    def on_stop(signum: int, frame: FrameType | None = None) -> None:
        if handler.env.global_rank == 0 and hasattr(submission.function, "checkpoint"):
            job_environment._checkpoint(
                submission, paths.submitted_pickle, submission._timeout_countdown
            )
        handler._exit()

    return on_stop


# Parameters and their defaults: `update_parameters` accepts exactly these names.
_DEFAULTS: dict[str, tp.Any] = {
    "job_name": "submitit",
    "partition": None,
    "account": None,
    "qos": None,
    "time": 5,  # minutes, as submitit's timeout_min
    "nodes": 1,
    "ntasks_per_node": None,
    "gpus_per_node": None,
    "cpus_per_task": None,
    "mem": None,  # "8G"; submitit's mem_gb is converted
    "mem_per_gpu": None,
    "constraint": None,
    "exclude": None,
    "nodelist": None,
    "dependency": None,
    "exclusive": None,
    "comment": None,
    "signal_delay_s": None,  # USR2 this long before the limit (see the module doc)
    "array_parallelism": 256,
    "setup": None,  # shell lines run before the task
    "additional_parameters": None,  # {"option": value}: more `#SBATCH --option=value`
}


class MusterExecutor(core.PicklingExecutor):
    """Runs submitit jobs on the Muster cluster the `muster` CLI reaches (its
    `MUSTER_NATS_URL` or `.muster/cluster.json`), signed with the user's key."""

    job_class = MusterJob

    def __init__(
        self,
        folder: str | Path,
        max_num_timeout: int = 3,
        max_pickle_size_gb: float = 1.0,
        python: str | None = None,
    ) -> None:
        super().__init__(folder, max_num_timeout=max_num_timeout)
        self.max_pickle_size_gb = max_pickle_size_gb
        self.python = shlex.quote(sys.executable) if python is None else python

    @classmethod
    def _equivalence_dict(cls) -> core.EquivalenceDict:
        return {
            "name": "job_name",
            "timeout_min": "time",
            "mem_gb": "mem",
            "nodes": "nodes",
            "cpus_per_task": "cpus_per_task",
            "gpus_per_node": "gpus_per_node",
            "tasks_per_node": "ntasks_per_node",
        }

    @classmethod
    def _valid_parameters(cls) -> set[str]:
        return set(_DEFAULTS)

    def _convert_parameters(self, params: dict[str, tp.Any]) -> dict[str, tp.Any]:
        params = super()._convert_parameters(params)
        if isinstance(params.get("mem"), int | float):
            params["mem"] = f"{max(1, round(params['mem'] * 1024))}M"
        return params

    def _internal_update_parameters(self, **kwargs: tp.Any) -> None:
        unknown = sorted(set(kwargs) - set(_DEFAULTS))
        if unknown:
            known = "\n  - ".join(f"{k} (default: {v!r})" for k, v in sorted(_DEFAULTS.items()))
            raise ValueError(
                f"Unavailable parameter(s): {unknown}\nValid parameters are:\n  - {known}"
            )
        if (kwargs.get("ntasks_per_node") or 1) != 1:
            raise ValueError(
                "ntasks_per_node: Muster runs one task per node; use gpus_per_node and start"
                " processes per GPU in the function (e.g. torch.distributed)"
            )
        super()._internal_update_parameters(**kwargs)

    def _internal_process_submissions(
        self, delayed_submissions: list[utils.DelayedSubmission]
    ) -> list[core.Job[tp.Any]]:
        if len(delayed_submissions) == 1:
            return super()._internal_process_submissions(delayed_submissions)
        folder = utils.JobPaths.get_first_id_independent_folder(self.folder)
        folder.mkdir(parents=True, exist_ok=True)
        pickles = []
        for i, delayed in enumerate(delayed_submissions):
            path = folder / f"{os.getpid()}_{id(delayed)}_{i}.pkl"
            delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            delayed.dump(path)
            pickles.append(path)
        array = MusterExecutor(self.folder, self.max_num_timeout, python=self.python)
        array.update_parameters(**self.parameters)
        array.parameters["map_count"] = len(delayed_submissions)
        self._throttle()
        first = array._submit_command(self._submitit_command_str)
        jobs: list[core.Job[tp.Any]] = [
            MusterJob(folder=self.folder, job_id=f"{first.job_id}_{a}", tasks=[0])
            for a in range(len(delayed_submissions))
        ]
        for job, path in zip(jobs, pickles, strict=True):
            job.paths.move_temporary_file(path, "submitted_pickle")
        return jobs

    @property
    def _submitit_command_str(self) -> str:
        return f"{self.python} -u -m submitit.core._submit {shlex.quote(str(self.folder))}"

    def _num_tasks(self) -> int:
        return int(self.parameters.get("nodes", 1))

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return batch_script(command, self.folder, self.parameters)

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        return _muster("submit", "--json", str(submission_file_path))

    @staticmethod
    def _get_job_id_from_submission_command(string: bytes | str) -> str:
        text = string.decode() if isinstance(string, bytes) else string
        try:
            return str(json.loads(text)["job_ids"][0])
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise utils.FailedSubmissionError(
                f"could not read a job id from `muster submit --json`: {text!r}"
            ) from err

    @classmethod
    def affinity(cls) -> int:
        """Available (1, below Slurm's 2) where a Muster cluster is configured."""
        state = Path(os.environ.get("MUSTER_STATE_DIR", ".muster")) / "cluster.json"
        return 1 if os.environ.get("MUSTER_NATS_URL") or state.exists() else -1


def batch_script(command: str, folder: str | Path, params: dict[str, tp.Any]) -> str:
    """The batch script of one submission (pure: parameters in, text out)."""
    p = {**_DEFAULTS, **params}
    count = p.pop("map_count", None)
    base = utils.JobPaths.get_first_id_independent_folder(folder)
    out_name = "%A_%a" if count else "%j"
    options: list[str] = [
        f"--job-name={p['job_name']}",
        f"--time={int(p['time'])}",
        f"--nodes={int(p['nodes'])}",
        f"--output={base}/{out_name}_batch.out",
    ]
    for key in ("partition", "account", "qos", "gpus_per_node", "cpus_per_task", "mem"):
        if p[key] is not None:
            options.append(f"--{key.replace('_', '-')}={p[key]}")
    for key in ("mem_per_gpu", "constraint", "exclude", "nodelist", "dependency", "comment"):
        if p[key] is not None:
            options.append(f"--{key.replace('_', '-')}={p[key]}")
    if p["exclusive"]:
        options.append("--exclusive" if p["exclusive"] is True else f"--exclusive={p['exclusive']}")
    if p["signal_delay_s"]:
        options.append(f"--signal=USR2@{int(p['signal_delay_s'])}")
    if count:
        options.append(f"--array=0-{count - 1}%{min(count, int(p['array_parallelism']))}")
    for key, value in (p["additional_parameters"] or {}).items():
        options.append(f"--{key}" if value is True else f"--{key}={value}")
    pythonpath = os.pathsep.join(x for x in sys.path if x and Path(x).is_dir())
    folder_s = shlex.quote(str(folder))
    lines = [
        "#!/bin/bash",
        "# Written by submitit's Muster plugin (muster/submitit_plugin.py)",
        *(f"#SBATCH {o}" for o in options),
        "",
        "export SUBMITIT_EXECUTOR=muster",
        f"export PYTHONPATH={shlex.quote(pythonpath)}",
        *(p["setup"] or ()),
        'ref="$SLURM_JOB_ID"',
        '[ -n "${SLURM_ARRAY_JOB_ID:-}" ] && ref="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        f"folder={folder_s}",
        'folder="${folder//%j/$ref}"',
        'mkdir -p "$folder"',
        'log="$folder/${ref}_${SLURM_PROCID:-0}_log"',
        f'exec {command} >>"$log.out" 2>>"$log.err"',
        "",
    ]
    return "\n".join(lines)
