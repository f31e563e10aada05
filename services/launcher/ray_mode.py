"""Pure core: the command of a node's worker in Ray mode (`muster submit --ray`).

Every node of the attempt runs `python -m services.launcher.raynode`: on node rank 0
it starts a Ray head whose GCS listens on the port the launcher chose free there (the
rendezvous endpoint torchrun would use), waits for every node's raylet, and runs the
job's script as the Ray driver with `RAY_ADDRESS` set; on the other nodes it starts a
raylet joined to that head and lives as long as the head does. Each raylet offers the
node's allocated GPUs (`CUDA_VISIBLE_DEVICES`) and the job's CPUs, so Ray places tasks
only on what Muster allocated. Muster owns restarts: a fault ends the generation, and
the next one (fewer nodes for `--nodes MIN:MAX`, or a spare) starts a new Ray cluster
and a new driver.
"""

from __future__ import annotations

from services.launcher.env import WorkerPlacement
from shared.jobspec import JobSpec

RAYNODE_MODULE = "services.launcher.raynode"
# Ray's object store when the job gives no --mem: small, so a test or a CPU job on a
# shared machine does not reserve a third of its memory (Ray's default).
DEFAULT_OBJECT_STORE_MIB = 512


def object_store_mib(spec: JobSpec) -> int:
    """A tenth of the job's memory per node, never under Ray's 75 MiB floor."""
    if spec.mem_mib:
        return max(80, spec.mem_mib // 10)
    return DEFAULT_OBJECT_STORE_MIB


def ray_argv(
    spec: JobSpec, placement: WorkerPlacement, python: str, command: list[str], address: str
) -> list[str]:
    """`placement`'s worker: `command` (the script's own) as the driver on node rank 0,
    a raylet elsewhere; `address` is the node's own, as its agent fills it in."""
    role = "head" if placement.node_rank == 0 else "worker"
    return [
        python,
        "-m",
        RAYNODE_MODULE,
        role,
        f"--head={placement.rdzv_endpoint}",
        f"--address={address}",
        f"--nodes={placement.nnodes}",
        f"--gpus={placement.gpus_per_node}",
        f"--cpus={max(1, spec.cpus_per_task * max(1, spec.ntasks_per_node))}",
        f"--object-store-mib={object_store_mib(spec)}",
        f"--temp-dir=/tmp/muster-ray/{placement.rdzv_id}",
        "--",
        *command,
    ]
