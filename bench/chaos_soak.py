"""The chaos soak: the long variant of tests/chaos, as many seeded faults as asked.

Runs chaos runs back to back (seeds S, S+1, ...; each a fresh bed of its own, see
tests/chaos/harness.py) of `--per-run` faults each, one every `--slot-s` seconds on
average, until `--faults` faults have been carried out; with `--nats-servers mixed`
every other run is on the three-server JetStream cluster (one server of three killed)
and the rest on one server with the nodes in network namespaces (partitions). Every bed
is secured as `muster up` runs (bus credentials and permissions per service and per
node, SCRAM PostgreSQL with a role per service, signed requests); `--insecure` runs the
old bed without authentication. Prints a
line per run (its seed, so a failing one can be replayed with
`MUSTER_CHAOS_SEED=<seed> pytest tests/chaos/test_chaos.py`), then one JSON object:
`faults_injected` (by kind), `jobs_submitted`, `jobs_completed`, `step_states` (the
srun steps, by how they ended), `jobs_failed` ("seed:job" -> "STATE: reason" of each
job that ended badly), `violations` (by
invariant; must be all zero), `orphans`, `failover_s` (p50/p99 per kind: from a fault
to the first job progress committed after it was undone), and the failing seeds.

    .venv/bin/python bench/chaos_soak.py --faults 1000 --seed 100 [--per-run 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.checker import tally
from tests.chaos.faults import FaultRecord
from tests.chaos.harness import ChaosSettings, Report, failover, run_chaos
from tests.chaos.schedule import counts


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--faults", type=int, default=1000, help="faults in all (default 1000)")
    p.add_argument("--seed", type=int, default=1, help="the first run's seed")
    p.add_argument("--per-run", type=int, default=50, help="faults per run (default 50)")
    p.add_argument("--slot-s", type=float, default=3.5, help="seconds per fault (default 3.5)")
    p.add_argument("--nats-servers", choices=("1", "3", "mixed"), default="mixed")
    p.add_argument("--replicas", type=int, default=1, help="of every service (default 1)")
    p.add_argument("--insecure", action="store_true", help="no bus auth, trust PG logins")
    return p.parse_args()


class Totals:
    def __init__(self) -> None:
        self.faults: Counter[str] = Counter()
        self.violations: Counter[str] = Counter()
        self.steps: Counter[str] = Counter()  # srun steps by how they ended
        self.records: list[FaultRecord] = []
        self.jobs_submitted = self.jobs_completed = self.orphans = 0
        self.cancels = self.forged_refused = self.forged_accepted = 0
        self.failing_seeds: list[int] = []
        self.failed: dict[str, str] = {}  # "seed:job" -> "STATE: reason"
        self.services_exited: list[str] = []
        self.runs = 0

    def add(self, report: Report) -> None:
        self.faults.update(counts([r.fault for r in report.faults]))
        self.violations.update(tally(report.violations))
        self.records += report.faults
        self.jobs_submitted += report.jobs_submitted
        self.jobs_completed += report.job_states.get("COMPLETED", 0)
        self.steps.update(report.step_states)
        self.orphans += report.orphans
        self.cancels += report.cancels
        self.forged_refused += report.forged_refused
        self.forged_accepted += len(report.forged_accepted)
        self.services_exited += [f"{report.seed}:{k}" for k in report.services_exited]
        self.failed |= {f"{report.seed}:{j}": why for j, why in report.failed.items()}
        self.runs += 1
        if report.verdict():
            self.failing_seeds.append(report.seed)

    def summary(self, wall_s: float, secure: bool) -> dict[str, object]:
        return {
            "runs": self.runs,
            "auth": "on" if secure else "off",
            "wall_s": round(wall_s, 1),
            "faults_injected": dict(self.faults),
            "faults_total": sum(self.faults.values()),
            "jobs_submitted": self.jobs_submitted,
            "jobs_completed": self.jobs_completed,
            "step_states": dict(self.steps),
            "jobs_failed": self.failed,
            "violations": dict(self.violations),
            "orphans": self.orphans,
            "cancels": self.cancels,
            "forged_cancels_refused": self.forged_refused,
            "forged_cancels_accepted": self.forged_accepted,
            "services_exited": self.services_exited,
            "failing_seeds": self.failing_seeds,
            "failover_s": failover(self.records),
        }


async def soak(args: argparse.Namespace, totals: Totals) -> None:
    seed, left = args.seed, args.faults
    while left > 0:
        n = min(args.per_run, left)
        servers = {"1": 1, "3": 3}.get(args.nats_servers, 3 if seed % 2 else 1)
        settings = ChaosSettings(
            seed=seed, n_faults=n, duration_s=n * args.slot_s,
            nats_servers=servers, replicas=args.replicas, secure=not args.insecure,
        )  # fmt: skip
        report = await run_chaos(settings)
        totals.add(report)
        line = report.summary()
        print(json.dumps({"run": seed, "nats_servers": servers, **line}), flush=True)
        if report.verdict():
            print(report.verdict(), flush=True)
        seed, left = seed + 1, left - n


async def main() -> None:
    args = _args()
    totals = Totals()
    began = time.monotonic()
    task = asyncio.current_task()
    assert task is not None
    # `timeout` or Ctrl-C: the run in hand stops its bed, and what was done is printed.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await soak(args, totals)
    finally:
        # Also when stopped early: the figures then cover the runs that finished.
        summary = totals.summary(time.monotonic() - began, secure=not args.insecure)
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        sys.exit(1)
