"""Pure: which selected jobs `scontrol requeue` / `muster requeue` acts on, and who may.

As Slurm's: a running (or starting) job is requeued; a pending one is in the queue
already, a finished one stays finished (each skipped with a message that says so);
only the job's owner, a coordinator of its account or an operator may. A requeue that
holds (`scontrol requeuehold`) holds an operator's pick of another's job as an
operator's hold (JobHeldAdmin), as `hold` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission.actions import Decision, Target, Verb, decide
from services.admission.config import load_config

CONFIG = load_config(
    (Path(__file__).resolve().parents[3] / "deploy" / "local" / "cluster.toml").read_text()
)


def job(job_id: int, owner: str = "alice", state: str = "RUNNING") -> Target:
    return Target(job_id=job_id, owner=owner, account="research", state=state)


PENDING = "job 2 is pending: it is in the queue already"
ENDED = "job 3 already ended (COMPLETED); submit it again to run it again"

CASES = {
    "an owner requeues a running and a starting job": (
        "alice", [job(1), job(2, state="STARTING")], Decision(act_on=(1, 2)),
    ),
    "a pending and a finished job are skipped, each saying why": (
        "alice", [job(1), job(2, state="PENDING"), job(3, state="COMPLETED")],
        Decision(act_on=(1,), skipped=(PENDING, ENDED)),
    ),
    "nothing to requeue refuses the request with the reasons": (
        "alice", [job(2, state="PENDING")],
        Decision(refusal=PENDING, code="invalid_state", skipped=(PENDING,)),
    ),
    "a job being stopped is not requeued": (
        "alice", [job(1, state="COMPLETING")],
        Decision(
            refusal="job 1 is COMPLETING; only a running job can be requeued",
            code="invalid_state",
            skipped=("job 1 is COMPLETING; only a running job can be requeued",),
        ),
    ),
    "another user may not requeue someone's job": (
        "bob", [job(1)],
        Decision(
            refusal="job 1: 'bob' may not requeue a job of 'alice' in account 'research': "
            "only its owner, a coordinator of its account, or an operator may",
            code="forbidden",
        ),
    ),
    "an operator requeues anyone's job, and a hold with it is an operator's": (
        "root", [job(1), job(2, owner="root")], Decision(act_on=(1, 2), operator_hold=(1,)),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("actor", "targets", "want"), CASES.values(), ids=CASES.keys())
def test_requeue_acts_on_running_jobs_of_the_actor(
    actor: str, targets: list[Target], want: Decision
) -> None:
    assert decide(Verb.REQUEUE, actor, targets, CONFIG) == want
