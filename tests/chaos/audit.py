"""Shell of the chaos checker: what PostgreSQL and the dead-letter stream hold once a
run is over, judged by the invariants of the design brief (rules in checker.py).

Every function takes a connection and returns violations; none raises for a broken
invariant, so one run reports every violation it found, not only the first.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

import asyncpg
import nats
from nats.js.errors import NotFoundError

from muster.client import connect_options
from shared.bus import DLQ_STREAM
from shared.events import JobFinished, JobRequeued, decode
from shared.states import TERMINAL
from shared.urls import nats_servers
from tests.chaos.checker import (
    Invariant,
    NodeSample,
    Placement,
    Violation,
    excluded_placements,
)

# Each GPU's holding from the moment its node joined the allocation to the moment it
# left it: dropped by a shrink or swapped for a spare (`dropped_at`), or released with
# the allocation. (Each stamp is its transaction's start, so an end may read a moment
# before its start: an empty span, never an error.)
OVERLAPS = """
WITH held AS (
  SELECT g.node, g.gpu, g.alloc_id,
         tstzrange(n.added_at, greatest(n.added_at,
                   coalesce(n.dropped_at, a.released_at, 'infinity'))) AS span
  FROM allocation_gpus g
  JOIN allocation_nodes n USING (alloc_id, node)
  JOIN allocations a USING (alloc_id)
)
SELECT x.node, x.gpu, x.alloc_id AS one, y.alloc_id AS other
FROM held x JOIN held y ON x.node = y.node AND x.gpu = y.gpu AND x.alloc_id < y.alloc_id
WHERE x.span && y.span
"""
# A deposed placer's allocation would be one of an older epoch made after a newer one's.
EPOCHS_OUT_OF_ORDER = """
SELECT old.alloc_id AS old, new.alloc_id AS new, old.epoch AS old_epoch, new.epoch AS new_epoch
FROM allocations old JOIN allocations new
  ON old.epoch < new.epoch AND old.created_at > new.created_at
"""
ATTEMPT_NODES = """
SELECT t.job_id, t.attempt, t.seq, t.nodes,
       coalesce(array_agg(n.node) FILTER (WHERE n.node IS NOT NULL), '{}') AS allocated
FROM attempts t
LEFT JOIN allocations a ON a.job_id = t.job_id AND a.attempt = t.attempt
LEFT JOIN allocation_nodes n ON n.alloc_id = a.alloc_id
GROUP BY t.job_id, t.attempt, t.seq, t.nodes
"""
CHARGES = "SELECT job_id, attempt, charged FROM usage_charges"
ENDINGS = (
    "SELECT payload FROM outbox WHERE subject IN ('muster.job.finished', 'muster.job.requeued')"
)


async def gpus_held_once(db: asyncpg.Connection) -> list[Violation]:
    return [
        Violation(
            Invariant.GPU_ONCE,
            f"GPU {r['gpu']} of {r['node']} held by allocations {r['one']} and {r['other']}",
        )
        for r in await db.fetch(OVERLAPS)
    ]


async def ended_badly(db: asyncpg.Connection) -> dict[int, str]:
    """The jobs that ended in a failure state, each as "STATE: reason" (not a verdict:
    a job the workload's cancel or an application XID ends may end so by design)."""
    rows = await db.fetch(
        "SELECT job_id, state, reason FROM job_runs"
        " WHERE state IN ('FAILED', 'NODE_FAIL', 'OUT_OF_MEMORY', 'TIMEOUT') ORDER BY job_id"
    )
    return {r["job_id"]: f"{r['state']}: {r['reason']}" for r in rows}


async def jobs_kept(
    db: asyncpg.Connection, accepted: Iterable[int]
) -> tuple[list[Violation], dict[str, int]]:
    """Invariant 2: every job admission accepted is in the database and ended in exactly
    one terminal state (one job.finished), or waits with a reason. Also returns how many
    jobs ended in each state."""
    found = []
    known = {r["job_id"] for r in await db.fetch("SELECT job_id FROM jobs")}
    found += [
        Violation(Invariant.NO_JOB_LOST, f"job {j} was accepted but is not in the database")
        for j in sorted(set(accepted) - known)
    ]
    runs = {r["job_id"]: r for r in await db.fetch("SELECT job_id, state, reason FROM job_runs")}
    reasons: dict[int, str] = {
        r["job_id"]: r["reason"]
        for r in await db.fetch("SELECT job_id, reason FROM pending_reasons")
    }
    finished = await _finished_events(db)
    states: Counter[str] = Counter()
    for job_id in sorted(known):
        run = runs.get(job_id)
        state = run["state"] if run else "PENDING"
        states[state] += 1
        why = (run["reason"] if run else "") or reasons.get(job_id, "")
        if state not in TERMINAL and not why:
            found.append(Violation(Invariant.NO_JOB_LOST, f"job {job_id} is {state}, no reason"))
        want = 1 if state in TERMINAL else 0
        if finished[job_id] != want:
            found.append(
                Violation(
                    Invariant.NO_JOB_LOST,
                    f"job {job_id} is {state} with {finished[job_id]} job.finished events",
                )
            )
    return found, dict(states)


async def steps_settled(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 2 for srun steps: a step accepted is answered. Once its job has ended,
    no step of it is still RUNNING (its tasks ended with the job, and whichever launcher
    replica coordinates it now recorded how)."""
    rows = await db.fetch(
        "SELECT s.job_id, s.step_id, r.state FROM job_steps s JOIN job_runs r USING (job_id)"
        " WHERE s.state = 'RUNNING' AND r.state = ANY($1::text[]) ORDER BY 1, 2",
        sorted(TERMINAL),
    )
    return [
        Violation(
            Invariant.NO_JOB_LOST,
            f"step {r['job_id']}.{r['step_id']} is still RUNNING; its job is {r['state']}",
        )
        for r in rows
    ]


# Steps that held GPUs, with when: the audit pairs those of one job and one start.
HELD_STEPS = (
    "SELECT job_id, step_id, attempt, generation, gpus::text AS gpus, started_at,"
    " coalesce(ended_at, clock_timestamp()) AS ended_at FROM job_steps"
    " WHERE gpus <> '{}'::jsonb ORDER BY job_id, step_id"
)


HeldStep = tuple[int, set[tuple[str, int]], datetime, datetime]  # step, GPUs, ran from, to


async def step_gpus_held_once(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 1 within a job: no two of its steps (of one start) held one GPU at
    once: from the GPUs each step held and when it ran (steps_core.layout)."""
    steps: dict[
        tuple[int, int, int], list[tuple[int, set[tuple[str, int]], datetime, datetime]]
    ] = {}
    for r in await db.fetch(HELD_STEPS):
        held = {(node, g) for node, gs in json.loads(r["gpus"]).items() for g in gs}
        key = (r["job_id"], r["attempt"], r["generation"])
        steps.setdefault(key, []).append((r["step_id"], held, r["started_at"], r["ended_at"]))
    found = []
    for (job_id, _, _), ran in sorted(steps.items()):
        for i, (one, gpus, began, ended) in enumerate(ran):
            for other, others, began2, ended2 in ran[i + 1 :]:
                shared = gpus & others
                if shared and began < ended2 and began2 < ended:
                    found.append(
                        Violation(
                            Invariant.GPU_ONCE,
                            f"steps {job_id}.{one} and {job_id}.{other} both held "
                            f"{sorted(shared)} at once",
                        )
                    )
    return found


async def _finished_events(db: asyncpg.Connection) -> Counter[int]:
    rows = await db.fetch("SELECT payload FROM outbox WHERE subject = 'muster.job.finished'")
    count: Counter[int] = Counter()
    for r in rows:
        event = decode(bytes(r["payload"]))
        if isinstance(event, JobFinished):
            count[event.job_id] += 1
    return count


async def gangs_whole(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 3 in the database: every generation started only on allocated nodes."""
    return [
        Violation(
            Invariant.GANG,
            f"job {r['job_id']} attempt {r['attempt']} generation {r['seq']} ran on"
            f" {sorted(set(r['nodes']) - set(r['allocated']))}, not allocated",
        )
        for r in await db.fetch(ATTEMPT_NODES)
        if not set(r["nodes"]) <= set(r["allocated"])
    ]


# The chaos bed's own record (never the product's): every node state as it commits, and
# every node added to an allocation, stamped when the row was written. Deferred
# constraint triggers run at commit, so a state's stamp is when others could first see
# it; the placer's `added_at` is its transaction's start, before it read the nodes. The
# functions run as the bed's owner, so any service's role may fire them.
JOURNAL = """
CREATE TABLE chaos_node_states (
    node text NOT NULL, state text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_placements (
    alloc_id bigint NOT NULL, node text NOT NULL, began timestamptz NOT NULL,
    inserted timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION chaos_node_state() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO chaos_node_states(node, state) VALUES (NEW.name, NEW.state);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER chaos_node_state AFTER INSERT OR UPDATE OF state ON nodes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_node_state();
CREATE FUNCTION chaos_placement() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public AS $$
BEGIN
    IF NEW.live THEN
        INSERT INTO chaos_placements(alloc_id, node, began)
        VALUES (NEW.alloc_id, NEW.node, NEW.added_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_placement AFTER INSERT OR UPDATE OF live, added_at ON allocation_nodes
    FOR EACH ROW EXECUTE FUNCTION chaos_placement();
"""


async def install_journal(db: asyncpg.Connection) -> None:
    """Record node states and placements for invariant 4 (after the migrations)."""
    await db.execute(JOURNAL)


async def excluded_nodes_unused(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 4 from the journal: a node added to an allocation while excluded."""
    transitions: dict[str, list[NodeSample]] = {}
    for r in await db.fetch(
        "SELECT node, state, extract(epoch FROM at)::float8 AS t FROM chaos_node_states ORDER BY at"
    ):
        transitions.setdefault(r["node"], []).append(NodeSample(r["t"], r["state"]))
    rows = await db.fetch(
        "SELECT alloc_id, node, extract(epoch FROM began)::float8 AS began,"
        " extract(epoch FROM inserted)::float8 AS inserted FROM chaos_placements"
    )
    placements = [Placement(r["alloc_id"], r["node"], r["began"], r["inserted"]) for r in rows]
    return excluded_placements(transitions, placements)


async def one_placer(db: asyncpg.Connection) -> list[Violation]:
    return [
        Violation(
            Invariant.ONE_PLACER,
            f"allocation {r['old']} of epoch {r['old_epoch']} made after allocation"
            f" {r['new']} of epoch {r['new_epoch']}",
        )
        for r in await db.fetch(EPOCHS_OUT_OF_ORDER)
    ]


# Invariant 8's last line of defence: the triggers through which the database refuses
# a write from a replica that does not hold the job's shard (or the placer's lease).
FENCES = {
    "allocations": "allocations_fenced",
    "job_runs": "job_runs_fenced",
    "attempts": "attempts_fenced",
}


async def fences_in_place(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 8: every fencing trigger is there and enabled at the end of the run."""
    rows = await db.fetch(
        "SELECT c.relname AS tbl, t.tgname AS name, t.tgenabled <> 'D' AS enabled"
        " FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE NOT t.tgisinternal"
    )
    have = {(r["tbl"], r["name"]) for r in rows if r["enabled"]}
    return [
        Violation(Invariant.ONE_OWNER, f"fence {name} on {table} is missing or disabled")
        for table, name in FENCES.items()
        if (table, name) not in have
    ]


async def usage_once(db: asyncpg.Connection) -> list[Violation]:
    """Invariant 6: what fairshare charged each attempt equals the GPU-seconds the
    launcher said it used when it ended it (job.requeued or job.finished), the usage
    totals equal the charges, and the hourly usage (`muster report`) the totals."""
    used: dict[tuple[int, int], float] = {}
    for r in await db.fetch(ENDINGS):
        event = decode(bytes(r["payload"]))
        if isinstance(event, JobFinished | JobRequeued):
            used[(event.job_id, event.attempt)] = event.gpu_seconds
    charged = {(r["job_id"], r["attempt"]): r["charged"] for r in await db.fetch(CHARGES)}
    found = [
        Violation(
            Invariant.USAGE_ONCE,
            f"job {job} attempt {attempt} used {used.get((job, attempt), 0.0):.3f} GPU-s,"
            f" charged {charged.get((job, attempt), 0.0):.3f}",
        )
        for job, attempt in sorted(set(used) | set(charged))
        if not _same(used.get((job, attempt), 0.0), charged.get((job, attempt), 0.0))
    ]
    total = await db.fetchval("SELECT coalesce(sum(gpu_seconds), 0) FROM usage")
    if not _same(total, sum(charged.values())):
        found.append(
            Violation(
                Invariant.USAGE_ONCE,
                f"usage holds {total:.3f} GPU-s, the charges {sum(charged.values()):.3f}",
            )
        )
    hourly = await db.fetchval("SELECT coalesce(sum(gpu_seconds), 0) FROM usage_hours")
    if not _same(hourly, total):  # what `muster report` sums
        found.append(
            Violation(
                Invariant.USAGE_ONCE,
                f"usage by the hour holds {hourly:.3f} GPU-s, usage {total:.3f}",
            )
        )
    return found


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


async def dead_letters(nats_url: str, poison: bytes) -> tuple[list[Violation], int]:
    """Invariant 9: the dead-letter stream holds the poison the test sent and nothing
    else. Returns the violations and how many copies of the poison it holds (one per
    consumer of its subject). Read with the operator's credential on a secured bus."""
    options = connect_options(nats_url, operator=True)
    nc = await nats.connect(nats_servers(nats_url), connect_timeout=5, **options)
    try:
        js = nc.jetstream()
        info = await js.stream_info(DLQ_STREAM)
        found, copies = [], 0
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(DLQ_STREAM, seq)
            except NotFoundError:
                continue
            if msg.data == poison:
                copies += 1
            else:
                found.append(
                    Violation(
                        Invariant.DEAD_LETTERS,
                        f"{msg.subject} dead-lettered {(msg.data or b'')[:160]!r}",
                    )
                )
        if copies == 0:
            found.append(Violation(Invariant.DEAD_LETTERS, "the poison was not dead-lettered"))
        return found, copies
    finally:
        await nc.close()
