"""Pure core (plus one probe): what confinement and which site hooks a node agent gives
each worker, from the node's isolation settings and the worker's `WorkerLimits`.

`NodeIsolation` is built once at agent start (`probe_node`: the GPU device nodes and
the block devices the I/O caps apply to are read from the machine then); `for_worker`
is the pure rule that turns it and one worker's spec into the `Isolation` stepd applies.
"""

from __future__ import annotations

import hashlib

import msgspec

from services.launcher.cgroups import detect, device_number, enter_agent_leaf, gpu_devices
from services.launcher.cgroups_core import DevNum, IoLimit, Limits, cgroup_name, denied_gpus
from services.launcher.hooks_core import HOOK_VARIABLES
from services.launcher.worker_table import Isolation
from shared.api import WorkerLimits

MIB = 1024 * 1024


class CgroupMode(msgspec.Struct, frozen=True, kw_only=True):
    enabled: bool = True  # "auto": a job cgroup where the node has usable cgroups
    required: bool = False  # "required": refuse to start a worker unconfined


def cgroup_mode(setting: str) -> CgroupMode:
    """`MUSTER_CGROUPS`: auto (default), required, or off."""
    if setting == "off":
        return CgroupMode(enabled=False)
    return CgroupMode(required=setting == "required")


class NodeIsolation(msgspec.Struct, frozen=True, kw_only=True):
    mode: CgroupMode = CgroupMode()
    cgroup_root: str = "muster"
    scope: str = ""  # keeps two agents on one machine (a test cluster) apart
    pids_max: int | None = None
    cpu_quota: bool = True
    gpus: dict[int, DevNum] = {}  # this node's GPU device nodes, by index
    io_devices: tuple[DevNum, ...] = ()
    prolog: str = ""
    epilog: str = ""
    task_prolog: str = ""
    hook_timeout_s: float = 60.0


def probe_node(
    *,
    cgroups: str = "auto",
    cgroup_root: str = "muster",
    state_folder: str = "",
    pids_max: int = 0,
    cpu_quota: bool = True,
    gpu_devices_template: str = "/dev/nvidia{index}",
    io_devices: str = "",
    prolog: str = "",
    epilog: str = "",
    task_prolog: str = "",
    hook_timeout_s: float = 60.0,
) -> NodeIsolation:
    """The node's isolation, its devices read from the machine now. On cgroup v2 the
    agent moves itself into its cgroup's leaf here (`cgroups.enter_agent_leaf`), so
    every stepd it starts can make job cgroups beside it."""
    if cgroups != "off":
        enter_agent_leaf(detect())
    blocks = (device_number(p.strip(), block=True) for p in io_devices.split(",") if p.strip())
    return NodeIsolation(
        mode=cgroup_mode(cgroups),
        cgroup_root=cgroup_root,
        scope=hashlib.sha256(state_folder.encode()).hexdigest()[:8] if state_folder else "",
        pids_max=pids_max or None,
        cpu_quota=cpu_quota,
        gpus=gpu_devices(gpu_devices_template),
        io_devices=tuple(d for d in blocks if d is not None),
        prolog=prolog,
        epilog=epilog,
        task_prolog=task_prolog,
        hook_timeout_s=hook_timeout_s,
    )


def worker_limits(node: NodeIsolation, limits: WorkerLimits | None) -> Limits:
    """The cgroup limits of one worker. GPUs unknown (an older launcher): none denied."""
    if limits is None:
        return Limits(pids_max=node.pids_max)
    deny = denied_gpus(node.gpus, limits.gpus) if limits.gpus is not None else ()
    return Limits(
        memory_bytes=limits.memory_mib * MIB if limits.memory_mib else None,
        cpus=limits.cpus if node.cpu_quota else None,
        pids_max=node.pids_max,
        io=IoLimit(
            weight=limits.io_weight, read_bps=limits.io_read_bps, write_bps=limits.io_write_bps
        ),
        io_devices=node.io_devices,
        deny_devices=deny,
    )


def for_worker(
    node: NodeIsolation,
    *,
    job_id: int,
    attempt: int,
    generation: int,
    node_name: str,
    env: dict[str, str],
    limits: WorkerLimits | None,
) -> Isolation:
    """What stepd applies around one worker."""
    name = cgroup_name(job_id, attempt, generation, node_name)
    hook_env = {k: env[k] for k in HOOK_VARIABLES if k in env} | {"SLURMD_NODENAME": node_name}
    return Isolation(
        cgroups=node.mode.enabled,
        require_cgroups=node.mode.required,
        cgroup_root=node.cgroup_root,
        cgroup_name=f"{name}_{node.scope}" if node.scope else name,
        limits=worker_limits(node, limits),
        prolog=node.prolog,
        epilog=node.epilog,
        task_prolog=node.task_prolog,
        hook_timeout_s=node.hook_timeout_s,
        hook_env=hook_env,
    )
