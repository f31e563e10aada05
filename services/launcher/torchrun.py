"""Pure core: the command line a node's worker runs.

Launch modes (docs/launching.md):

- once per node (default): the job's script runs once on every node of the attempt,
  with RANK = node rank and WORLD_SIZE = number of nodes (see `env.build_env`);
- in a container (`spec.container_image`): once per node, inside the image (see
  `container_mode`);
- Ray (`spec.ray`): a Ray head on node rank 0 runs the script as its driver, raylets
  on the others (see `ray_mode`);
- torchrun (`spec.torchrun`): every node runs `python -m torch.distributed.run`, which
  starts `nproc_per_node` processes and sets their per-process RANK, LOCAL_RANK,
  WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK.

Muster, not torchrun, owns restarts and elasticity: torchrun gets `--max-restarts=0`
(a failed worker fails the node's worker, and the coordinator decides), and every
attempt gets a fresh rendezvous id and the exact node count it was placed on. A
`--nnodes=MIN:MAX` range would make the c10d rendezvous wait `last_call_timeout`
(30 s) for more nodes after MIN joined, or close before all of this attempt's nodes
arrived; Muster already knows how many there are. `--node-rank` is not passed: the
c10d backend ignores it (torch warns), ranks come from the rendezvous.
"""

from __future__ import annotations

from services.launcher.container_mode import container_argv
from services.launcher.env import WorkerPlacement
from services.launcher.ray_mode import ray_argv
from shared.jobspec import JobSpec

TORCHRUN_MODULE = "torch.distributed.run"
SPOOL = "{spool}"  # placeholders only the node's agent can fill: see `fill_on_node`
NODE_ADDRESS = "{node_address}"


def fill_on_node(text: str, *, spool: str, address: str) -> str:
    """A worker's argument or variable with the node's own facts in: the folder its
    script was written to and the node's address."""
    return text.replace(SPOOL, spool).replace(NODE_ADDRESS, address)


def nproc_per_node(spec: JobSpec, placement: WorkerPlacement) -> int:
    """One process per allocated GPU; a CPU-only job runs `ntasks_per_node` of them."""
    if placement.gpus_per_node > 0:
        return placement.gpus_per_node
    return max(1, spec.ntasks_per_node)


def torchrun_argv(spec: JobSpec, placement: WorkerPlacement, python: str) -> list[str]:
    """`python -m torch.distributed.run ...` for `placement`'s node.

    Node rank 0 hosts the c10d store on `placement.rdzv_endpoint` (a port the
    launcher chose free on that node); the other nodes only connect to it. A script
    that is not a `.py` file is executed directly (`--no-python`), so it needs its
    executable bit and a `#!` line.
    """
    is_host = "true" if placement.node_rank == 0 else "false"
    argv = [
        python,
        "-m",
        TORCHRUN_MODULE,
        f"--nnodes={placement.nnodes}",
        f"--nproc-per-node={nproc_per_node(spec, placement)}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={placement.rdzv_endpoint}",
        f"--rdzv-id={placement.rdzv_id}",
        f"--rdzv-conf=is_host={is_host}",
        # The node's own address, filled in by its agent: torchrun would otherwise
        # advertise whatever the host name resolves to, which other nodes may not reach.
        f"--local-addr={NODE_ADDRESS}",
        "--max-restarts=0",
    ]
    if not is_python_script(spec.script):
        argv.append("--no-python")
    return [*argv, spec.script, *spec.args]


def script_argv(spec: JobSpec, python: str) -> list[str]:
    """The once-per-node command: a `.py` script under `python`, else the file itself
    (executed through its `#!` line, as sbatch requires of batch scripts)."""
    if is_python_script(spec.script):
        return [python, spec.script, *spec.args]
    return [spec.script, *spec.args]


def worker_argv(spec: JobSpec, placement: WorkerPlacement, python: str) -> list[str]:
    """The command of `placement`'s worker in the job's launch mode."""
    if spec.torchrun:
        return torchrun_argv(spec, placement, python)
    if spec.ray:
        return ray_argv(spec, placement, python, script_argv(spec, python), NODE_ADDRESS)
    if spec.container_image:
        # Inside the image the script runs through its own #! line: the node's python
        # is not there.
        return container_argv(spec, python, [spec.script, *spec.args], SPOOL)
    return script_argv(spec, python)


def is_python_script(script: str) -> bool:
    return script.endswith(".py")
