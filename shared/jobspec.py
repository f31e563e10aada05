"""Contracts: the job request as admission accepts it and every service reads it.

A `JobSpec` is what `muster submit` sends and what the `jobs` table stores (as msgspec
JSON). It crosses process boundaries, so it is a frozen Struct; new fields are added with
defaults, never renamed or retyped.
"""

from __future__ import annotations

from typing import Annotated, NewType

import msgspec

JobId = NewType("JobId", int)
NodeName = NewType("NodeName", str)

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]


class Dependency(msgspec.Struct, frozen=True, kw_only=True):
    """One `-d` term: `afterok:12`, `singleton`, ..."""

    kind: str  # after, afterok, afternotok, afterany, aftercorr, singleton
    job_ids: tuple[int, ...] = ()
    delay_s: int = 0
    # `afterok:12_3`: array 12's task 3, as written; admission replaces each by the
    # task's own job id in `job_ids` before the job is stored (`resolve_tasks`)
    tasks: tuple[tuple[int, int], ...] = ()


class JobSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A validated job request. Sizes are per node unless the name says total."""

    name: str = "job"
    user: str
    account: str = "default"
    partition: str = "normal"
    qos: str = "normal"
    script: str  # the script's text, captured at submission as sbatch does
    script_name: str = "script.sh"  # its file name (keeps `.py` for torchrun)
    args: tuple[str, ...] = ()
    workdir: str = "/tmp"
    nodes_min: Positive = 1
    nodes_max: Positive = 1
    gpus_per_node: NonNegative = 0
    gpus_total: NonNegative | None = None
    gpu_model: str | None = None
    ntasks_per_node: Positive = 1
    # `--gpus-per-task` as asked (admission also counts it into `gpus_per_node`): each
    # task of a bare `srun` is bound to this many of its node's GPUs, as Slurm's srun
    # takes SLURM_GPUS_PER_TASK from the batch script's environment. None: not asked.
    gpus_per_task: Positive | None = None
    cpus_per_task: Positive = 1
    mem_mib: NonNegative | None = None
    time_limit_s: Positive = 3600
    exclusive: bool = False
    required_nodes: tuple[str, ...] = ()
    excluded_nodes: tuple[str, ...] = ()
    constraint: str | None = None
    max_switches: Positive | None = None
    switches_wait_s: NonNegative = 0
    requeue: bool = True
    signal: str | None = None  # e.g. "USR1"
    signal_before_s: NonNegative = 0
    signal_batch_only: bool = False
    dependencies: tuple[Dependency, ...] = ()
    dependency_any: bool = False  # '?' separated: any one satisfied is enough
    array_spec: str | None = None
    array_task_id: int | None = None
    array_job_id: int | None = None
    begin_at: float | None = None  # epoch seconds
    hold: bool = False
    nice: int = 0
    comment: str | None = None
    export: str = "ALL"
    env: dict[str, str] = {}
    output: str | None = None  # pattern with %j %x %u %N %A %a
    error: str | None = None
    torchrun: bool = False
    ray: bool = False  # a Ray cluster on the allocation, the script its driver
    # The script runs on node rank 0 only, as Slurm's batch script runs on its batch
    # host; the other nodes hold the allocation for its steps (srun) and the job ends
    # as that script does. False: once on every node (Muster's default; docs/steps.md).
    batch_first_node: bool = False
    # pyxis's options: run the script in a container of this image (podman), with these
    # SRC:DST[:ro] bind mounts, starting in this folder inside it.
    container_image: str = ""
    container_mounts: tuple[str, ...] = ()
    container_workdir: str = ""
    elastic: bool = False  # nodes_min < nodes_max
    # Added by admission: every partition `-p a,b` named, in order; `partition` is the one
    # admission chose (the first that validates). Empty when none was named.
    partitions: tuple[str, ...] = ()
    array_max_running: Positive | None = None  # the `%K` of `--array=0-15%4`
    # Added by admission from the account's / partition's [io] settings: storage I/O
    # the job's cgroup gets on each node (docs/isolation.md); None: not limited.
    io_weight: int | None = None
    io_read_bps: int | None = None
    io_write_bps: int | None = None

    @property
    def gpus_requested(self) -> int:
        return self.gpus_per_node * self.nodes_max

    @property
    def depends_on(self) -> frozenset[int]:
        """The jobs its dependencies name."""
        return frozenset(j for d in self.dependencies for j in d.job_ids)

    @property
    def task_refs(self) -> frozenset[tuple[int, int]]:
        """The array tasks its dependencies name as ARRAY_TASK, not yet resolved."""
        return frozenset(t for d in self.dependencies for t in d.tasks)
