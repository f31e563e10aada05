"""Pure core: the environment a job worker starts with.

`build_env` turns a job's spec and one worker's placement into the exact variables the
worker process gets: the user's environment filtered by `--export`, Muster's own
variables, the torch.distributed rendezvous variables, `CUDA_VISIBLE_DEVICES`, and the
`SLURM_*` set that existing `#SBATCH` scripts read. No I/O, no clock: the same inputs
always give the same dict. See docs/launching.md for the full table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from itertools import groupby

import msgspec

from shared.arrays import parse_array
from shared.exports import export_assignments, exported_env
from shared.jobspec import JobSpec

__all__ = ["build_env", "export_assignments", "exported_env", "job_env", "place_worker"]

# A job's PATH when the submitter exported none (`--export=NONE`, or a client that sent
# no environment): the system's, never a daemon's.
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class WorkerPlacement(msgspec.Struct, frozen=True, kw_only=True):
    """Where one node's worker of one generation runs, as the coordinator decided it.

    `attempt` is the allocation's number, `generation` the start of the workers within
    the job's life (also its restart count); docs/launching.md, "Attempt, generation,
    restart count", says what moves them.

    `nodelist` is in node-rank order: `nodelist[node_rank] == node`, and rank 0 hosts
    the rendezvous (`master_addr`). `gpus` are this node's allocated GPU indices (NVML /
    PCI order); `build_env` sorts them, so callers may pass them in any order.
    """

    job_id: int
    attempt: int
    generation: int
    node: str
    node_rank: int
    nnodes: int
    nodelist: tuple[str, ...]
    gpus: tuple[int, ...] = ()
    gpus_per_node: int = 0
    master_addr: str
    master_port: int
    rdzv_endpoint: str
    rdzv_id: str
    job_name: str = "job"
    user: str
    account: str = "default"
    partition: str = "normal"
    array_job_id: int | None = None
    array_task_id: int | None = None
    workdir: str = "/tmp"
    elastic_min: int = 1
    elastic_max: int = 1


def place_worker(
    spec: JobSpec,
    *,
    job_id: int,
    attempt: int,
    generation: int,
    node: str,
    nodelist: Iterable[str],
    gpus: Iterable[int],
    master_port: int,
    master_addr: str | None = None,
) -> WorkerPlacement:
    """The placement of `node`'s worker, with everything derivable taken from `spec`.

    The master (rendezvous host) is the first node of `nodelist`, reached at
    `master_addr` (default: its name); the rendezvous id is new for every generation so
    a restarted job never joins a stale rendezvous.
    """
    nodes = tuple(nodelist)
    master = master_addr or nodes[0]
    return WorkerPlacement(
        job_id=job_id,
        attempt=attempt,
        generation=generation,
        node=node,
        node_rank=nodes.index(node),
        nnodes=len(nodes),
        nodelist=nodes,
        gpus=tuple(sorted(gpus)),
        gpus_per_node=spec.gpus_per_node,
        master_addr=master,
        master_port=master_port,
        rdzv_endpoint=f"{master}:{master_port}",
        rdzv_id=rdzv_id(job_id, attempt, generation),
        job_name=spec.name,
        user=spec.user,
        account=spec.account,
        partition=spec.partition,
        array_job_id=spec.array_job_id,
        array_task_id=spec.array_task_id,
        workdir=spec.workdir,
        elastic_min=spec.nodes_min,
        elastic_max=spec.nodes_max,
    )


def rdzv_id(job_id: int, attempt: int, generation: int) -> str:
    """The torch rendezvous id of one generation: `<job>-<attempt>-<generation>`."""
    return f"{job_id}-{attempt}-{generation}"


# Variables the launcher owns: inherited copies are dropped so a value from the agent's
# own environment (or a parent job) can never leak into a worker.
_OWNED_PREFIXES = ("MUSTER_", "SLURM_", "SLURMD_", "TORCHELASTIC_", "PET_")
_OWNED_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "NNODES",
        "NODE_RANK",
        "GROUP_RANK",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
    }
)


def build_env(
    spec: JobSpec, placement: WorkerPlacement, base_env: Mapping[str, str]
) -> dict[str, str]:
    """The complete environment of `placement`'s worker process.

    Layers, later wins: `base_env` filtered by `spec.export`; `spec.env`; the
    assignments of an `--export=VAR=val` list; then the launcher's own variables, which
    nothing can override. In torchrun mode the per-process variables (RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK) are left to torchrun, which sets them for
    each process it starts; in once-per-node mode the node's one process gets them.
    """
    env = exported_env(spec.export, base_env)
    env.update(spec.env)
    env.update(export_assignments(spec.export))
    for key in [k for k in env if _is_owned(k)]:
        del env[key]
    env.update(muster_vars(placement))
    env.update(rendezvous_vars(placement, torchrun=spec.torchrun))
    env.update(gpu_vars(placement))
    env.update(slurm_vars(spec, placement))
    return env


def job_env(spec: JobSpec, placement: WorkerPlacement) -> dict[str, str]:
    """A worker's environment as the launcher sends it: the submitter's exported
    environment (admission folded it into `spec.env`), never the launcher's own, and a
    PATH even when none was exported."""
    env = build_env(spec, placement, {})
    env.setdefault("PATH", SYSTEM_PATH)
    return env


def _is_owned(key: str) -> bool:
    return key in _OWNED_NAMES or key.startswith(_OWNED_PREFIXES)


def muster_vars(p: WorkerPlacement) -> dict[str, str]:
    return {
        "MUSTER_JOB_ID": str(p.job_id),
        "MUSTER_JOB_NAME": p.job_name,
        "MUSTER_ATTEMPT": str(p.attempt),
        "MUSTER_GENERATION": str(p.generation),
        "MUSTER_RESTART_COUNT": str(p.generation),
        "MUSTER_NODE": p.node,
        "MUSTER_NODELIST": ",".join(p.nodelist),
        "MUSTER_NODES_MIN": str(p.elastic_min),
        "MUSTER_NODES_MAX": str(p.elastic_max),
    }


def rendezvous_vars(p: WorkerPlacement, *, torchrun: bool) -> dict[str, str]:
    """torch.distributed's env:// variables for this node's worker."""
    env = {
        "MASTER_ADDR": p.master_addr,
        "MASTER_PORT": str(p.master_port),
        "NNODES": str(p.nnodes),
        "NODE_RANK": str(p.node_rank),
    }
    if not torchrun:
        # One process per node: the node is the rank.
        env |= {
            "WORLD_SIZE": str(p.nnodes),
            "RANK": str(p.node_rank),
            "GROUP_RANK": str(p.node_rank),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    return env


def gpu_vars(p: WorkerPlacement) -> dict[str, str]:
    """CUDA device visibility. CUDA enumerates fastest-first by default; PCI_BUS_ID
    makes its indices match NVML's, which is what the placer allocated."""
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in sorted(p.gpus)),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }


def slurm_vars(spec: JobSpec, p: WorkerPlacement) -> dict[str, str]:
    """The SLURM_* compatibility set, one task per node as `srun --ntasks-per-node=1`;
    a script on the first node only (sbatch's) is told the job's tasks, as sbatch's is."""
    per_node = spec.ntasks_per_node if spec.batch_first_node else 1
    env = {
        "SLURM_JOB_ID": str(p.job_id),
        "SLURM_JOBID": str(p.job_id),
        "SLURM_JOB_NAME": p.job_name,
        "SLURM_JOB_USER": p.user,
        "SLURM_JOB_NODELIST": compress_hostlist(p.nodelist),
        "SLURM_NODELIST": compress_hostlist(p.nodelist),
        "SLURM_JOB_NUM_NODES": str(p.nnodes),
        "SLURM_NNODES": str(p.nnodes),
        "SLURM_NODEID": str(p.node_rank),
        "SLURMD_NODENAME": p.node,
        "SLURM_PROCID": str(p.node_rank),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": str(p.nnodes * per_node),
        "SLURM_NPROCS": str(p.nnodes * per_node),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_TASKS_PER_NODE": tasks_per_node([per_node] * p.nnodes),
        "SLURM_CPUS_PER_TASK": str(spec.cpus_per_task),
        "SLURM_RESTART_COUNT": str(p.generation),
        "SLURM_SUBMIT_DIR": p.workdir,
        "SLURM_JOB_ACCOUNT": p.account,
        "SLURM_JOB_PARTITION": p.partition,
        "SLURM_GPUS_ON_NODE": str(len(p.gpus)),
        "SLURM_JOB_GPUS": ",".join(str(g) for g in sorted(p.gpus)),
    }
    if spec.gpus_per_task is not None:  # what each task of a bare srun is bound to
        env["SLURM_GPUS_PER_TASK"] = str(spec.gpus_per_task)
    if p.array_task_id is not None:
        env["SLURM_ARRAY_TASK_ID"] = str(p.array_task_id)
        env["SLURM_ARRAY_JOB_ID"] = str(p.array_job_id if p.array_job_id is not None else p.job_id)
        env |= array_vars(spec.array_spec)
    if spec.mem_mib is not None:
        env["SLURM_MEM_PER_NODE"] = str(spec.mem_mib)
    return env


def array_vars(array_spec: str | None) -> dict[str, str]:
    """An array task is told its array's shape, as Slurm tells it: how many tasks, the
    lowest and highest id, and the ids' step when they have one (`0-15:4`: 4; none
    for `1,2,5`). A script shards its data by them (task ID of COUNT)."""
    try:
        ids = parse_array(array_spec or "", max_index=2**31)
    except ValueError:  # admission accepted it; a spec it cannot read tells nothing
        return {}
    env = {
        "SLURM_ARRAY_TASK_COUNT": str(len(ids.task_ids)),
        "SLURM_ARRAY_TASK_MIN": str(ids.task_ids[0]),
        "SLURM_ARRAY_TASK_MAX": str(ids.task_ids[-1]),
    }
    if ids.step is not None:
        env["SLURM_ARRAY_TASK_STEP"] = str(ids.step)
    return env


def tasks_per_node(counts: Iterable[int]) -> str:
    """Slurm's SLURM_TASKS_PER_NODE: each node's task count in node order, a run of equal
    counts written once with its length, `2(x3),1` for 2, 2, 2, 1."""
    runs = [(n, len(list(same))) for n, same in groupby(counts)]
    return ",".join(f"{n}(x{k})" if k > 1 else str(n) for n, k in runs)


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def compress_hostlist(hosts: Iterable[str]) -> str:
    """Slurm's compressed hostlist: `node01,node02,node03,gpu7` -> `gpu7,node[01-03]`.

    Names group by prefix and digit width (zero padding is kept); each group's numbers
    are sorted and consecutive runs become `a-b`. Names without a numeric suffix stay as
    they are. Duplicates are dropped.
    """
    plain: set[str] = set()
    groups: dict[tuple[str, int], set[int]] = {}
    for host in hosts:
        m = _NUMBERED.match(host)
        if m is None:
            plain.add(host)
            continue
        prefix, digits = m.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), set()).add(int(digits))
    parts = [(h, h) for h in plain]
    for (prefix, width), numbers in groups.items():
        runs = _runs(sorted(numbers))
        text = ",".join(_fmt_run(a, b, width) for a, b in runs)
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            parts.append((prefix, f"{prefix}{text}"))
        else:
            parts.append((prefix, f"{prefix}[{text}]"))
    return ",".join(text for _, text in sorted(parts))


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return runs


def _fmt_run(a: int, b: int, width: int) -> str:
    lo, hi = str(a).zfill(width), str(b).zfill(width)
    return lo if a == b else f"{lo}-{hi}"
