"""Entry point of one node's agent: `python -m muster.node`.

One process per node hosts the health probe and the launcher's node executor, as a
real node would run one agent daemon; both are independent of the cluster services.
What must outlive the agent (its worker table, the contact file its workers fence on,
the count of simulated reboots) lives in the node's state folder,
`<MUSTER_STATE_DIR>/nodes/<node>`. At start the agent re-adopts its workers before it
registers, so `node.registered` lists what still runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from muster.node_fabric import configured_fabric
from services.health.fabric import watcher_from
from services.health.gpu import GpuBackend
from services.health.machine import machine_size
from services.health.probe import Boots, NodeProbe, kernel_boot_id
from services.launcher.accounts import account_policy
from services.launcher.agent import NodeExecutor
from services.launcher.isolation import NodeIsolation, probe_node
from services.launcher.worker_table import node_state_folder
from shared.agent_auth import agent_trusted_keys
from shared.bus import Bus
from shared.constraint import CONTAINER
from shared.runtime import run_service, until_ready
from shared.settings import NodeSettings


def make_backend(settings: NodeSettings) -> GpuBackend:
    if settings.gpu_backend == "nvml":
        from services.health.nvml_backend import NvmlGpuBackend

        return NvmlGpuBackend()
    from services.health.sim_backend import SimulatedGpuBackend

    return SimulatedGpuBackend(settings.node, gpu_count=settings.gpus, model=settings.gpu_model)


def node_isolation(settings: NodeSettings, state_folder: Path) -> NodeIsolation:
    """The node's cgroup and hook settings, its devices probed now."""
    return probe_node(
        cgroups=settings.cgroups,
        cgroup_root=settings.cgroup_root,
        state_folder=str(state_folder),
        pids_max=settings.job_pids_max,
        cpu_quota=settings.cgroup_cpu_quota,
        gpu_devices_template=settings.gpu_device_template,
        io_devices=settings.io_devices,
        prolog=settings.prolog,
        epilog=settings.epilog,
        task_prolog=settings.task_prolog,
        hook_timeout_s=settings.hook_timeout_s,
    )


def main() -> None:
    settings = NodeSettings.from_env(os.environ)
    if not settings.node:
        raise SystemExit("MUSTER_NODE must name this node")

    spool_root = str(Path(settings.state_dir).resolve() / "spool" / settings.node)
    state_folder = node_state_folder(settings.state_dir, settings.node)
    kernel_boot = kernel_boot_id()
    cpus, memory_mib = machine_size(settings.cpus, settings.memory_mib)

    async def serve(stop: asyncio.Event) -> None:
        bus = await until_ready(  # NATS may not be up yet: wait for it, do not exit
            "connect to NATS",
            lambda: Bus.connect(
                settings.nats_url,
                name=f"node-{settings.node}",
                stream_replicas=settings.stream_replicas,  # or it would scale them down
                creds=settings.nats_creds,
                tls_ca=settings.nats_tls_ca,
                inbox_prefix=settings.nats_inbox_prefix,
            ),
            stop,
        )
        backend = make_backend(settings)
        try:
            if not settings.nats_creds:  # a secured agent has no JetStream API: services do it
                await until_ready("create streams", bus.ensure_streams, stop)
            executor = NodeExecutor(
                bus,
                settings.node,
                allow_root=settings.allow_root_jobs,
                spool_root=spool_root,
                state_folder=state_folder,
                boot_id=kernel_boot,
                fence_s=settings.fence_s,
                grace_s=settings.fault_kill_wait_s,
                trusted_keys=agent_trusted_keys(settings.state_dir, settings.launcher_public_keys),
                accounts=account_policy(
                    settings.min_job_uid, settings.allowed_job_users, settings.allow_root_jobs
                ),
                address=settings.node_address,
                isolation=node_isolation(settings, state_folder),
            )
            executor.touch_contact()  # connected: the control plane is reachable now
            await executor.adopt()
            await executor.serve()
            probe = NodeProbe(
                bus,
                backend,
                node=settings.node,
                address=settings.node_address,
                topology=tuple(p for p in settings.topology.split("/") if p),
                features=node_features(settings),
                heartbeat_s=settings.heartbeat_interval_s,
                kmsg_path=settings.kmsg_path,
                expected_gpus=settings.gpus if settings.gpu_backend == "sim" else None,
                boots=Boots(kernel_boot, state_folder / "sim_reboots"),
                running=executor.running_workers,
                on_contact=executor.touch_contact,
                fence_s=settings.fence_s,
                fence=executor.fence_all,
                fabric=watcher_from(settings, time.monotonic, configured_fabric(settings)),
                cpus=cpus,
                memory_mib=memory_mib,
            )
            await probe.run(stop)
            await executor.shutdown(settings.fault_kill_wait_s)
        finally:
            backend.close()
            await bus.close()

    run_service(settings, serve)


def node_features(settings: NodeSettings) -> tuple[str, ...]:
    """The node's configured features, and "container" where jobs can run in one."""
    given = [f for f in settings.features.split(",") if f]
    runtime = settings.container_runtime
    if runtime == "podman" or (runtime == "auto" and shutil.which("podman")):
        given.append(CONTAINER)
    return tuple(dict.fromkeys(given))


if __name__ == "__main__":
    main()
