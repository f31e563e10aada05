"""Client: `scancel JOB.STEP` (and `muster cancel JOB.STEP`): a step of a running job
ended on every node, as Slurm's scancel ends one (docs/steps.md); `scancel -s SIG
JOB.STEP` sends its tasks the signal alone. The other references
go to admission as before; a step goes to the launcher's `step_cancel`, which stops
its tasks and has its coordinator record it CANCELLED (srun, if it waits, then exits).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

from muster.client import ApiRefused, current_user, request
from shared.api import Ok, StepCancelRequest

STEP_REF = re.compile(r"(\d+)\.(\d+)")


def split(refs: Iterable[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """(job, step) for each `JOB.STEP`, and the other references as they were."""
    steps: list[tuple[int, int]] = []
    others: list[str] = []
    for ref in refs:
        m = STEP_REF.fullmatch(ref.strip())
        if m:
            steps.append((int(m.group(1)), int(m.group(2))))
        else:
            others.append(ref)
    return steps, others


def cancel(url: str, steps: list[tuple[int, int]], prog: str, signal: str = "") -> int:
    """Each step ended (with `signal`: its tasks sent it, and left running); 1 if any was
    refused (each refusal printed), else 0."""
    rc = 0
    for job_id, step_id in steps:
        req = StepCancelRequest(user=current_user(), job_id=job_id, step_id=step_id, signal=signal)
        try:
            request(url, "step_cancel", req, Ok, timeout=30.0)
        except ApiRefused as err:
            print(f"{prog}: error: step {job_id}.{step_id}: {err}", file=sys.stderr)
            rc = 1
    return rc
