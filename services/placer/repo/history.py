"""Placer SQL, job history: the finished jobs runtime prediction learns from
(`core/predict.py`). Loads facts only; what they predict is the core's to say."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from asyncpg import Record

from services.placer.core.predict import Outcome
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.states import JobState

# Jobs that ran their course: a failure's early end says little about the next run.
LEARNED = sorted({JobState.COMPLETED, JobState.TIMEOUT})


HISTORY = 2000  # the finished jobs the predictor knows: the most recent ones

_OUTCOMES = (
    "SELECT r.job_id, j.spec, extract(epoch FROM r.ended_at - r.started_at)::float8 AS runtime"
    " FROM job_runs r JOIN jobs j USING (job_id)"
    " WHERE r.state = ANY($1::text[]) AND r.started_at IS NOT NULL AND r.ended_at IS NOT NULL"
)


async def load_outcomes(conn: Conn, last: int = HISTORY) -> list[tuple[int, Outcome]]:
    """The `last` jobs to finish, oldest first (the order the predictor learns them),
    each with its job id."""
    rows = await conn.fetch(
        _OUTCOMES + " ORDER BY r.ended_at DESC, r.job_id DESC LIMIT $2", LEARNED, last
    )
    return [_outcome(r) for r in reversed(rows)]


async def outcomes_of(conn: Conn, job_ids: Sequence[int]) -> list[tuple[int, Outcome]]:
    """The outcomes of these jobs that ran their course, in the order they ended: what
    the predictor adds after they finish, instead of reloading `load_outcomes` (a
    history of 2,000 jobs takes 35 ms to load, after every end)."""
    rows = await conn.fetch(
        _OUTCOMES + " AND r.job_id = ANY($2::bigint[]) ORDER BY r.ended_at, r.job_id",
        LEARNED,
        list(job_ids),
    )
    return [_outcome(r) for r in rows]


def _outcome(r: Record) -> tuple[int, Outcome]:
    spec = msgspec.json.decode(r["spec"], type=JobSpec)
    gpus = spec.nodes_min * spec.gpus_per_node if spec.gpus_total is None else spec.gpus_total
    return r["job_id"], Outcome(spec.user, spec.name, gpus, spec.time_limit_s, float(r["runtime"]))
