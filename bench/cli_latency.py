"""Per-call cost of the user's commands against an idle local cluster: `muster submit`,
`muster queue`, and the `sbatch` / `squeue` shims, each run as a fresh process the way
a sweep's loop or a monitoring script's poll runs them, beside a bare `python -c pass`
(the interpreter's own start, which no command can go under).

Wall time is what the user waits; CPU time (the child's user + system, from rusage) is
what the command itself costs, and is the steadier figure on a busy machine. Submits
are held (`--hold`), so the cluster stays idle while it is measured. Prints one line
per command, then one JSON object.

    .venv/bin/python bench/cli_latency.py [--calls 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._local import local_cluster, wait_for_nodes
from muster.shims import write_shims

SCRIPT = "#!/bin/bash\n#SBATCH --job-name=sweep --time=5\ntrue\n"


def timed(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one run of `argv`, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def figures(samples: list[tuple[float, float]]) -> dict[str, float]:
    """p50, p90 and p99 of the wall and of the CPU time, in ms (interpolated between
    the calls: with 30 calls, p99 is close to the slowest)."""
    out: dict[str, float] = {}
    for kind, values in (("wall", [w for w, _ in samples]), ("cpu", [c for _, c in samples])):
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        out[f"{kind}_p50_ms"] = round(statistics.median(values) * 1000, 1)
        out[f"{kind}_p90_ms"] = round(cuts[89] * 1000, 1)
        out[f"{kind}_p99_ms"] = round(cuts[98] * 1000, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args()
    python = sys.executable
    muster = str(Path(python).parent / "muster")  # the installed command, as users run it
    with local_cluster(1) as cluster, tempfile.TemporaryDirectory(prefix="cli-bench-") as tmp:
        folder = Path(tmp)
        (folder / "job.sh").write_text(SCRIPT)
        write_shims(folder / "bin")

        async def up() -> None:
            db = await asyncpg.connect(cluster.database_url)
            try:
                await wait_for_nodes(db, 1)
            finally:
                await db.close()

        asyncio.run(up())
        env = {**os.environ, "MUSTER_NATS_URL": cluster.nats_url, "MUSTER_USER": "root"}
        # as on a user's machine, the bytecode is compiled once and kept (a test runner's
        # PYTHONDONTWRITEBYTECODE would compile every module on every call), in a folder
        # of the benchmark's own so the checkout is left as it is
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        bin_ = folder / "bin"
        commands = {
            "python -c pass": [python, "-c", "pass"],
            "muster submit": [muster, "submit", "--hold", "job.sh"],
            "muster queue": [muster, "queue"],
            "sbatch --parsable": [str(bin_ / "sbatch"), "--parsable", "--hold", "job.sh"],
            "squeue -h": [str(bin_ / "squeue"), "-h"],
        }
        for argv in commands.values():  # warm the page cache and the bytecode
            timed(argv, env, folder)
        results: dict[str, dict[str, float]] = {}
        load_before = os.getloadavg()[0]  # the machine's other work, beside the figures
        for name, argv in commands.items():
            results[name] = figures([timed(argv, env, folder) for _ in range(args.calls)])
            print(f"{name:>20}: " + "  ".join(f"{k}={v}" for k, v in results[name].items()))
    goal_ms = 50.0
    commands_only = [r for n, r in results.items() if n != "python -c pass"]
    worst = max(r["wall_p50_ms"] for r in commands_only)
    worst_cpu = max(r["cpu_p50_ms"] for r in commands_only)
    print(
        json.dumps(
            {
                "bench": "cli_latency",
                "calls": args.calls,
                "goal_ms": goal_ms,
                "worst_command_wall_p50_ms": worst,
                "worst_command_cpu_p50_ms": worst_cpu,
                "load_average_before": round(load_before, 2),
                "load_average": round(os.getloadavg()[0], 2),
                "cpus": os.cpu_count(),
                "commands": results,
            }
        )
    )


if __name__ == "__main__":
    main()
