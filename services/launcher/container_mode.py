"""Pure core: a `--container-image` job's worker command (pyxis's options, on podman).

The worker runs `python -m services.launcher.containerrun` with the image, the bind
mounts and the working folder; that shell (run as the job's user, like any worker)
starts the script inside a container of the image with the worker's own environment,
the job's spool folder (where its script is) and mounts, the node's network, and the
allocated GPUs only. The launch modes that need more than one process tree per node
(`--ray`, `--torchrun`) are refused with a container at admission.
"""

from __future__ import annotations

from shared.jobspec import JobSpec

CONTAINERRUN_MODULE = "services.launcher.containerrun"


def container_argv(spec: JobSpec, python: str, command: list[str], spool: str) -> list[str]:
    """`command` (the script's own) inside a container of `spec.container_image`;
    `spool` is the folder the agent writes the script to (its placeholder here)."""
    return [
        python,
        "-m",
        CONTAINERRUN_MODULE,
        f"--image={spec.container_image}",
        *(f"--mount={m}" for m in spec.container_mounts),
        f"--workdir={spec.container_workdir or spec.workdir}",
        f"--mount={spool}:{spool}:ro",
        "--",
        *command,
    ]
