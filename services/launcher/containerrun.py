"""Shell: one worker's container (`--container-image`), run as the job's user.

`python -m services.launcher.containerrun --image=IMG [--mount=SRC[:DST[:ro]]]...
--workdir=DIR -- SCRIPT ARGS` (from `container_mode.container_argv`) runs `podman run`:

- the worker's whole environment (`--env-host`: the job's variables, `SLURM_*`,
  `CUDA_VISIBLE_DEVICES`) and the node's network (`--network=host`, so NCCL and
  rendezvous ports work as outside);
- as the job's user: a non-root user runs rootless podman with `--userns=keep-id`, so
  files written to mounts are theirs; root runs rootful podman as root;
- the allocated GPUs' device nodes only (`/dev/nvidiaN` for each index in
  `CUDA_VISIBLE_DEVICES`, plus `nvidiactl`, `nvidia-uvm`, `nvidia-uvm-tools`), where they
  exist;
- the worker's limits: its open-file and process limits (`--ulimit`, the process count
  capped at the kernel's pid_max, which the OCI runtime refuses above), and its cgroup
  as the container's parent, so the job's memory, CPU and pids caps hold inside it;
- `runc` as the OCI runtime where it is installed (crun refuses cgroup v1 / hybrid
  hosts), podman's default otherwise.

SIGTERM (a cancel, a preemption, the time limit) is passed to the container
(`podman kill`), which `--rm` removes once it has exited; the worker exits with the
script's status.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from services.launcher.wrapper_args import parse_wrapped

NVIDIA_SHARED = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="containerrun")
    p.add_argument("--image", required=True)
    p.add_argument("--mount", action="append", default=[])
    p.add_argument("--workdir", default="")
    return parse_wrapped(p, argv)


def volume(mount: str) -> str:
    """pyxis's `SRC[:DST[:ro|rw]]` as podman's `-v SRC:DST[:ro]`."""
    parts = mount.split(":")
    src = parts[0]
    dst = parts[1] if len(parts) > 1 and parts[1] else src
    flags = parts[2] if len(parts) > 2 else ""
    return f"{src}:{dst}:{flags}" if flags else f"{src}:{dst}"


def gpu_devices(visible: str, dev: str = "/dev") -> list[str]:
    """The device nodes of the GPUs in `visible` (CUDA_VISIBLE_DEVICES) that exist."""
    wanted = [f"{dev}/nvidia{i.strip()}" for i in visible.split(",") if i.strip().isdigit()]
    shared = [d.replace("/dev", dev, 1) for d in NVIDIA_SHARED]
    return [d for d in (*wanted, *shared) if Path(d).exists()] if wanted else []


def limits() -> list[str]:
    out = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out.append(f"--ulimit=nofile={soft}:{hard}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    try:
        cap = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        cap = 32768

    def capped(v: int) -> int:
        return cap if v == resource.RLIM_INFINITY else min(v, cap)

    out.append(f"--ulimit=nproc={capped(soft)}:{capped(hard)}")
    return out


def own_cgroup(proc: str = "/proc/self/cgroup") -> str | None:
    """This process's memory cgroup (v1) or its unified one (v2), as podman's
    `--cgroup-parent` takes it; None at the root."""
    try:
        lines = Path(proc).read_text().splitlines()
    except OSError:
        return None
    paths = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") or [""]:
            paths[c] = path
    mine = paths.get("memory") or paths.get("")
    return mine if mine and mine != "/" else None


def podman_argv(args: argparse.Namespace, podman: str, name: str) -> list[str]:
    argv = [podman]
    if shutil.which("runc"):
        argv += ["--runtime", "runc"]
    argv += ["run", "--rm", f"--name={name}", "--network=host", "--env-host", "--init"]
    if os.getuid() != 0:
        argv.append("--userns=keep-id")
    argv += limits()
    if parent := own_cgroup():
        argv.append(f"--cgroup-parent={parent}")
    for device in gpu_devices(os.environ.get("CUDA_VISIBLE_DEVICES", "")):
        argv.append(f"--device={device}")
    for mount in args.mount:
        argv += ["-v", volume(mount)]
    if args.workdir:
        argv += ["-w", args.workdir]
    return [*argv, args.image, *args.command]


def run(args: argparse.Namespace) -> int:
    podman = shutil.which("podman")
    if podman is None:
        print("containerrun: no container runtime (podman) on this node", file=sys.stderr)
        return 2
    name = f"muster-{os.environ.get('SLURM_JOB_ID', 'job')}-{os.getpid()}"
    child = subprocess.Popen(podman_argv(args, podman, name))

    def forward(signum: int, _frame: FrameType | None) -> None:
        subprocess.run(
            [podman, "kill", f"--signal={signal.Signals(signum).name}", name],
            capture_output=True,
            check=False,
        )

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    return child.wait()


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(parse(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
