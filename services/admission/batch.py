"""Shell: group commit of accepted single jobs.

Concurrent submissions queue their job here (`group_commit.py`); a flusher writes
everything queued in one transaction (job rows and their `job.submitted` outbox rows
together, so the outbox guarantee holds per job) and resolves each waiter with its job
id. While one transaction is in flight the next batch gathers, so under load a replica
commits hundreds of jobs per round trip instead of one; alone, a job waits for no one.
A failed transaction fails every job of its batch (none of them was stored).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import msgspec

from shared.db import OutboxRow, Pool
from shared.events import JobSubmitted, encode, subject_of
from shared.jobspec import JobSpec
from shared.telemetry import current_headers

from .group_commit import GroupCommit
from .policy import JobPolicy

MAX_BATCH = 500
MAX_INFLIGHT = 4

_INSERT_JOBS = """
INSERT INTO jobs(job_id, name, user_name, account, partition, qos, nodes_min, nodes_max,
                 gpus_per_node, time_limit_s, spec, held, tier, preemptible, can_preempt,
                 grace_s, min_runtime_s, needs_approval)
SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                     $6::text[], $7::int[], $8::int[], $9::int[], $10::int[], $11::jsonb[],
                     $12::bool[], $13::int[], $14::bool[], $15::bool[], $16::int[], $17::int[],
                     $18::bool[])
"""
_INSERT_OUTBOX = """
INSERT INTO outbox(event_id, subject, payload, headers)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[])
"""


class JobBatcher:
    def __init__(self, pool: Pool, kick: Callable[[Sequence[OutboxRow]], None]) -> None:
        self.pool = pool
        self.kick = kick  # the relay's: the rows just committed, published as they are
        self._commits = GroupCommit(self._write, max_batch=MAX_BATCH, inflight=MAX_INFLIGHT)

    async def insert(self, spec: JobSpec, policy: JobPolicy) -> int:
        return await self._commits.submit((spec, policy))

    async def _write(self, jobs: list[tuple[JobSpec, JobPolicy]]) -> list[int]:
        headers = json.dumps(current_headers())
        rows: list[OutboxRow] = []
        async with self.pool.acquire() as conn, conn.transaction():
            ids: list[int] = [
                r[0]
                for r in await conn.fetch(
                    "SELECT nextval('jobs_job_id_seq') FROM generate_series(1, $1)", len(jobs)
                )
            ]
            cols: list[list[object]] = [[] for _ in range(18)]
            events = []
            for job_id, (spec, policy) in zip(ids, jobs, strict=True):
                row = (
                    job_id, spec.name, spec.user, spec.account, spec.partition, spec.qos,
                    spec.nodes_min, spec.nodes_max, spec.gpus_per_node, spec.time_limit_s,
                    msgspec.json.encode(spec).decode(), spec.hold, policy.tier,
                    policy.preemptible, policy.can_preempt, policy.grace_s,
                    policy.min_runtime_s, policy.needs_approval,
                )  # fmt: skip
                for col, value in zip(cols, row, strict=True):
                    col.append(value)
                events.append(
                    JobSubmitted(
                        job_id=job_id,
                        user=spec.user,
                        account=spec.account,
                        partition=spec.partition,
                    )
                )
            rows = [OutboxRow(e.event_id, subject_of(e), encode(e), headers) for e in events]
            await conn.execute(_INSERT_JOBS, *cols)
            await conn.execute(
                _INSERT_OUTBOX,
                [r.event_id for r in rows],
                [r.subject for r in rows],
                [r.payload for r in rows],
                [r.headers for r in rows],
            )
        self.kick(rows)
        return ids
