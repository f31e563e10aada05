"""What a job cgroup adds to starting and ending one worker on this node: the same
`spawn_worker` + `wait` of `/bin/true`, without and with its cgroup (created with
memory, CPU, pids and a device deny, the worker forked inside, its outcome read, the
cgroup removed), `--runs` times each. Needs root and a usable cgroup (v1 or v2).
Prints a summary, then one JSON object.

    .venv/bin/python bench/cgroup_overhead.py [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.launcher import cgroups
from services.launcher.cgroups_core import DevNum, Limits
from services.launcher.executor import spawn_worker

LIMITS = Limits(
    memory_bytes=1 << 30, cpus=1.0, pids_max=64, deny_devices=(DevNum(major=195, minor=0),)
)


async def one(workdir: str, hierarchy: cgroups.Hierarchy | None, root: str, i: int) -> float:
    began = time.perf_counter()
    ref = cgroups.create(hierarchy, root, f"w{i}", LIMITS) if hierarchy else None
    worker = await spawn_worker(
        ["/bin/true"], {"PATH": "/usr/bin:/bin"}, workdir, "out", "out",
        allow_root=True, cgroup=ref, hierarchy=hierarchy,
    )  # fmt: skip
    await worker.wait()
    if ref is not None:
        cgroups.remove(ref)
    return (time.perf_counter() - began) * 1000


def _remove_root(hierarchy: cgroups.Hierarchy, root: str) -> None:
    for ctl, mount in hierarchy.mounts.items():
        top = Path(mount, hierarchy.base_of(ctl).lstrip("/"), root)
        if top.exists():
            top.rmdir()


async def main(runs: int) -> dict[str, object]:
    hierarchy = cgroups.detect()
    if hierarchy is None:
        raise SystemExit("no usable cgroup here")
    root = f"muster-bench-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as workdir:
        plain: list[float] = []
        confined: list[float] = []
        await one(workdir, hierarchy, root, -1)  # warm up: imports, first mkdirs
        for i in range(runs):  # interleaved, so machine load falls on both alike
            plain.append(await one(workdir, None, root, i))
            confined.append(await one(workdir, hierarchy, root, i))
    _remove_root(hierarchy, root)
    p50 = statistics.median
    return {
        "bench": "cgroup_overhead",
        "cgroup_version": str(hierarchy.version),
        "runs": runs,
        "plain_ms_p50": round(p50(plain), 2),
        "cgroup_ms_p50": round(p50(confined), 2),
        "added_ms_p50": round(p50(confined) - p50(plain), 2),
        "cgroup_ms_max": round(max(confined), 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    result = asyncio.run(main(parser.parse_args().runs))
    plain, confined = result["plain_ms_p50"], result["cgroup_ms_p50"]
    version, added = result["cgroup_version"], result["added_ms_p50"]
    print(f"worker start+end: {plain} ms plain, {confined} ms with its cgroup ({version}): {added}")
    print(json.dumps(result))
