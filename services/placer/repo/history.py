"""Placer SQL, job history: the finished jobs runtime prediction learns from
(`core/predict.py`). Loads facts only; what they predict is the core's to say."""

from __future__ import annotations

import msgspec

from services.placer.core.predict import Outcome
from shared.db import Conn
from shared.jobspec import JobSpec
from shared.states import JobState

# Jobs that ran their course: a failure's early end says little about the next run.
LEARNED = sorted({JobState.COMPLETED, JobState.TIMEOUT})


async def load_outcomes(conn: Conn, last: int = 2000) -> list[Outcome]:
    """The `last` jobs to finish, oldest first (the order the predictor learns them)."""
    rows = await conn.fetch(
        "SELECT j.spec, extract(epoch FROM r.ended_at - r.started_at)::float8 AS runtime"
        " FROM job_runs r JOIN jobs j USING (job_id)"
        " WHERE r.state = ANY($1::text[]) AND r.started_at IS NOT NULL"
        " AND r.ended_at IS NOT NULL ORDER BY r.ended_at DESC, r.job_id DESC LIMIT $2",
        LEARNED,
        last,
    )
    out = []
    for r in reversed(rows):
        spec = msgspec.json.decode(r["spec"], type=JobSpec)
        gpus = spec.nodes_min * spec.gpus_per_node if spec.gpus_total is None else spec.gpus_total
        out.append(Outcome(spec.user, spec.name, gpus, spec.time_limit_s, float(r["runtime"])))
    return out
