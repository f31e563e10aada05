"""Pure core of the chaos checker: facts in, violations of the design brief's invariants
out, each naming its invariant and what broke it.

Two kinds of facts: what the machine showed at one moment (`WorkerProc`s from /proc,
with the runs and allocations the database held then), judged by `Watch.observe` as the
run goes, and what the database holds at the end, judged by tests/chaos/audit.py with
the row-level rules here. No I/O and no clock: every time is passed in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from shared.states import LIVE_RUN, TERMINAL
from tests.chaos.machine import WorkerProc

# A worker of an ended attempt may take this long to go: the launcher's stop (SIGTERM,
# then SIGKILL after MUSTER_KILL_WAIT_S), or for a node cut off, its agent's fence
# (MUSTER_FENCE_S) and the same grace. "A few seconds later", with room for a loaded
# two-core machine.
STALE_GRACE_S = 12.0
# Clock ticks are 10 ms: a worker that started later than this after its run ended was
# started by someone who did not know it had ended.
START_SLACK_S = 0.05
# Node states that take no new work.
ENDED = TERMINAL | {"REQUEUED"}
EXCLUDED = frozenset({"SUSPECT", "CLEANING", "DRAINING", "DRAINED", "DOWN", "FAILED"})


class Invariant(StrEnum):
    GPU_ONCE = "1"
    NO_JOB_LOST = "2"
    GANG = "3"
    EXCLUDED_NODE = "4"
    ONE_PLACER = "5"
    USAGE_ONCE = "6"
    ONE_LIVE_ATTEMPT = "7"
    ONE_OWNER = "8"
    DEAD_LETTERS = "9"


@dataclass(frozen=True)
class Violation:
    invariant: Invariant
    detail: str


@dataclass(frozen=True)
class Run:
    """A job_runs row, as far as the checker needs it."""

    state: str
    attempt: int
    generation: int
    ended_at: float | None = None  # the database's clock, epoch seconds


def gpu_conflicts(procs: Sequence[WorkerProc]) -> list[Violation]:
    """Invariant 1 on the machine: two live workers of different generations on one GPU."""
    holders: dict[tuple[str, int], set[tuple[int, int, int]]] = defaultdict(set)
    for p in procs:
        for gpu in p.gpus:
            holders[(p.node, gpu)].add(p.run)
    return [
        Violation(Invariant.GPU_ONCE, f"GPU {gpu} of {node} used by workers of {sorted(runs)}")
        for (node, gpu), runs in sorted(holders.items())
        if len(runs) > 1
    ]


def outside_allocation(
    procs: Sequence[WorkerProc], allocated: Mapping[tuple[int, int], frozenset[str]]
) -> list[Violation]:
    """Invariant 3 on the machine: a worker runs only on a node of its attempt's allocation."""
    seen = sorted({(p.job_id, p.attempt, p.node) for p in procs})
    return [
        Violation(Invariant.GANG, f"job {j} attempt {a} has a worker on {n}, not allocated")
        for j, a, n in seen
        if n not in allocated.get((j, a), frozenset())
    ]


def is_stale(proc: WorkerProc, runs: Mapping[int, Run]) -> bool:
    """A worker of no live generation: its run ended, or moved to another attempt or
    generation."""
    run = runs.get(proc.job_id)
    return (
        run is None
        or run.state not in LIVE_RUN
        or (run.attempt, run.generation) != (proc.attempt, proc.generation)
    )


@dataclass
class LeaseWatch:
    """Invariant 8 as the leases show it: every lease (the placer's, the health
    monitor's, each launcher shard) changes holder only with a new, higher fencing epoch,
    and an epoch never goes back. Two owners under one epoch, or an old epoch coming
    back, would let the database's fence take a deposed owner's write for the owner's."""

    seen: dict[str, tuple[str, int]] = field(default_factory=dict)

    def observe(self, leases: Mapping[str, tuple[str, int]]) -> list[Violation]:
        found = []
        for name, (holder, epoch) in sorted(leases.items()):
            before = self.seen.get(name)
            if before is not None:
                was_holder, was_epoch = before
                if epoch < was_epoch:
                    found.append(
                        Violation(
                            Invariant.ONE_OWNER,
                            f"lease {name}: epoch went back from {was_epoch} to {epoch}",
                        )
                    )
                elif epoch == was_epoch and holder != was_holder and was_holder and holder:
                    found.append(
                        Violation(
                            Invariant.ONE_OWNER,
                            f"lease {name}: epoch {epoch} held by {was_holder} then {holder}",
                        )
                    )
            self.seen[name] = (holder, epoch)
        return found


@dataclass
class Watch:
    """What the run looked like so far: when each stale worker was first seen stale, and
    each job's last state, so a worker that outlives its attempt and a job that leaves
    a terminal state are caught as they happen."""

    stale_since: dict[tuple[int, int], float] = field(default_factory=dict)
    reported: set[tuple[int, int]] = field(default_factory=set)
    last_state: dict[int, str] = field(default_factory=dict)

    def observe(
        self,
        t: float,
        procs: Sequence[WorkerProc],
        runs: Mapping[int, Run],
        allocated: Mapping[tuple[int, int], frozenset[str]],
    ) -> list[Violation]:
        found = gpu_conflicts(procs) + outside_allocation(procs, allocated)
        found += self._terminal_left(runs)
        found += self._started_after_end(procs, runs)
        stale = {(p.pid, p.start): p for p in procs if is_stale(p, runs)}
        self.stale_since = {k: self.stale_since.get(k, t) for k in stale}
        for key, since in self.stale_since.items():
            if t - since > STALE_GRACE_S and key not in self.reported:
                self.reported.add(key)
                p = stale[key]
                run = runs.get(p.job_id)
                found.append(
                    Violation(
                        Invariant.ONE_LIVE_ATTEMPT,
                        f"pid {p.pid} of job {p.job_id} attempt {p.attempt} generation"
                        f" {p.generation} on {p.node} alive {t - since:.1f} s after its"
                        f" run became {run}",
                    )
                )
        return found

    def _started_after_end(
        self, procs: Sequence[WorkerProc], runs: Mapping[int, Run]
    ) -> list[Violation]:
        """Invariant 7 without a grace: no worker of a run starts after the run ended."""
        found = []
        for p in procs:
            run = runs.get(p.job_id)
            if run is None or run.ended_at is None or run.state not in ENDED:
                continue
            key = (p.pid, p.start)
            if p.started > run.ended_at + START_SLACK_S and key not in self.reported:
                self.reported.add(key)
                found.append(
                    Violation(
                        Invariant.ONE_LIVE_ATTEMPT,
                        f"pid {p.pid} of job {p.job_id} attempt {p.attempt} generation"
                        f" {p.generation} on {p.node} started"
                        f" {p.started - run.ended_at:.2f} s after its run ended {run.state}",
                    )
                )
        return found

    def _terminal_left(self, runs: Mapping[int, Run]) -> list[Violation]:
        found = []
        for job_id, run in runs.items():
            before = self.last_state.get(job_id)
            if before in TERMINAL and run.state != before:
                found.append(
                    Violation(Invariant.NO_JOB_LOST, f"job {job_id} left {before} for {run.state}")
                )
            self.last_state[job_id] = run.state
        return found


@dataclass(frozen=True)
class NodeSample:
    t: float  # the database's clock, epoch seconds
    state: str


@dataclass(frozen=True)
class Placement:
    """A node added to an allocation: `began` when the placer's transaction began (it
    read the nodes after that), `inserted` when the row was written."""

    alloc_id: int
    node: str
    began: float
    inserted: float


def excluded_placements(
    transitions: Mapping[str, Sequence[NodeSample]], placements: Iterable[Placement]
) -> list[Violation]:
    """Invariant 4: a node added to an allocation although it was excluded (its last
    committed state when the placer's transaction began) and did not come back before
    the row was written, so whatever the placer read of it said excluded.
    `transitions`: each node's states in order, stamped at their commit."""
    found = []
    for p in placements:
        seq = transitions.get(p.node, ())
        before = [s for s in seq if s.t <= p.began]
        if not before or before[-1].state not in EXCLUDED:
            continue
        if any(p.began < s.t <= p.inserted and s.state not in EXCLUDED for s in seq):
            continue  # it came back meanwhile: the placer may have read it UP
        found.append(
            Violation(
                Invariant.EXCLUDED_NODE,
                f"allocation {p.alloc_id} placed on {p.node} while it was {before[-1].state}"
                f" (since {before[-1].t:.3f}; the placer began at {p.began:.3f})",
            )
        )
    return found


def tally(violations: Iterable[Violation]) -> dict[str, int]:
    """How many violations of each invariant, every invariant named (0 where none)."""
    out = dict.fromkeys((i.value for i in Invariant), 0)
    for v in violations:
        out[v.invariant.value] += 1
    return out
