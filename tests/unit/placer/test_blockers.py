"""Table tests of the placer's blockers core: begin times, every dependency kind (and
aftercorr's task by task), `?`, singleton and the array throttle, each decided from
frozen facts at an injected `now`."""

from __future__ import annotations

from typing import Any

import pytest

from services.placer.core import Blocker, Waiting
from services.placer.core.blockers import Ended, Facts, blockers
from shared.jobspec import Dependency, JobSpec
from shared.states import JobState
from tests.unit.placer.helpers import T0

OK = Ended(end=JobState.COMPLETED, started_at=T0 - 600)
FAILED = Ended(end=JobState.FAILED, started_at=T0 - 600)
CANCELLED_EARLY = Ended(end=JobState.CANCELLED)
RUNNING_5MIN = Ended(started_at=T0 - 300)
QUEUED = Ended()


# array 5: task 0 running, task 1 failed, task 2 completed (job ids 5, 6, 7)
CORR = Facts(
    jobs={5: RUNNING_5MIN, 6: FAILED, 7: OK},
    tasks={5: (5, 6, 7)},
    task_ids={(5, 0): 5, (5, 1): 6, (5, 2): 7},
)


def spec(**kw: Any) -> JobSpec:
    kw.setdefault("user", "ada")
    return JobSpec(script="#!/bin/sh\n", **kw)


def dep(kind: str, *ids: int, delay_s: int = 0) -> Dependency:
    return Dependency(kind=kind, job_ids=ids, delay_s=delay_s)


def waiting(reason: Waiting, detail: str) -> Blocker:
    return Blocker(reason=reason, detail=detail)


CASES: dict[str, tuple[list[tuple[int, JobSpec]], Facts, dict[int, Blocker]]] = {
    "a job with nothing to wait for is not blocked": ([(10, spec())], Facts(), {}),
    "a begin time still ahead blocks with Slurm's BeginTime": (
        [(10, spec(begin_at=T0 + 60))],
        Facts(),
        {10: waiting(Waiting.BEGIN_TIME, "BeginTime: not before 2023-11-14T22:14:20 UTC")},
    ),
    "a begin time reached at exactly now no longer blocks": (
        [(10, spec(begin_at=T0))],
        Facts(),
        {},
    ),
    "a begin time is reported before an unmet dependency": (
        [(10, spec(begin_at=T0 + 60, dependencies=(dep("afterok", 7),)))],
        Facts(jobs={7: QUEUED}),
        {10: waiting(Waiting.BEGIN_TIME, "BeginTime: not before 2023-11-14T22:14:20 UTC")},
    ),
    "afterok waits while the job it names has not ended": (
        [(10, spec(dependencies=(dep("afterok", 7),)))],
        Facts(jobs={7: RUNNING_5MIN}),
        {10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterok:7")},
    ),
    "afterok holds once the job completed": (
        [(10, spec(dependencies=(dep("afterok", 7),)))],
        Facts(jobs={7: OK}),
        {},
    ),
    "afterok on a failed job can never be met": (
        [(10, spec(dependencies=(dep("afterok", 7),)))],
        Facts(jobs={7: FAILED}),
        {
            10: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: afterok:7 can no longer be met",
            )
        },
    ),
    "afternotok waits for the end, holds on a failure, never on a success": (
        [
            (10, spec(dependencies=(dep("afternotok", 7),))),
            (11, spec(dependencies=(dep("afternotok", 8),))),
            (12, spec(dependencies=(dep("afternotok", 9),))),
        ],
        Facts(jobs={7: RUNNING_5MIN, 8: FAILED, 9: OK}),
        {
            10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afternotok:7"),
            12: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: afternotok:9 can no longer be met",
            ),
        },
    ),
    "afterany holds on any end, a cancel before it ran included": (
        [
            (10, spec(dependencies=(dep("afterany", 7),))),
            (11, spec(dependencies=(dep("afterany", 8),))),
        ],
        Facts(jobs={7: CANCELLED_EARLY, 8: QUEUED}),
        {11: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterany:8")},
    ),
    "after holds once the job started; after:ID+MIN only that long after its start": (
        [
            (10, spec(dependencies=(dep("after", 7),))),
            (11, spec(dependencies=(dep("after", 7, delay_s=300),))),
            (12, spec(dependencies=(dep("after", 7, delay_s=301),))),
            (13, spec(dependencies=(dep("after", 8),))),
        ],
        Facts(jobs={7: RUNNING_5MIN, 8: QUEUED}),
        {
            12: waiting(Waiting.DEPENDENCY, "Dependency: waiting for after:7"),
            13: waiting(Waiting.DEPENDENCY, "Dependency: waiting for after:8"),
        },
    ),
    "a dependency on an array waits for every task of it": (
        [(10, spec(dependencies=(dep("afterok", 5),)))],
        Facts(jobs={6: OK, 7: RUNNING_5MIN}, tasks={5: (6, 7)}),
        {10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterok:5")},
    ),
    "aftercorr: each task waits for the task of its own index alone": (
        [
            (30 + t, spec(array_job_id=30, array_task_id=t, dependencies=(dep("aftercorr", 5),)))
            for t in range(4)
        ],
        CORR,
        {
            30: waiting(Waiting.DEPENDENCY, "Dependency: waiting for aftercorr:5"),
            31: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: aftercorr:5 can no longer be met",
            ),
        },  # task 2 follows a completed task; 5 has no task 3: nothing to wait for
    ),
    "aftercorr of a job that is not an array task waits for the whole array": (
        [(10, spec(dependencies=(dep("aftercorr", 5),)))],
        CORR,
        {
            10: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: aftercorr:5 can no longer be met",
            )
        },
    ),
    "aftercorr on a job that is not an array: that job, as afterok": (
        [(31, spec(array_job_id=30, array_task_id=1, dependencies=(dep("aftercorr", 7),)))],
        Facts(jobs={7: OK}),
        {},
    ),
    "all terms must hold; the detail names only the open ones": (
        [(10, spec(dependencies=(dep("afterok", 7, 8), dep("afterany", 9))))],
        Facts(jobs={7: OK, 8: QUEUED, 9: QUEUED}),
        {10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterok:8, afterany:9")},
    ),
    "one impossible term blocks forever unless '?' makes any term enough": (
        [(10, spec(dependencies=(dep("afterok", 7), dep("afterany", 8))))],
        Facts(jobs={7: FAILED, 8: QUEUED}),
        {
            10: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: afterok:7 can no longer be met",
            )
        },
    ),
    "with '?' one met term is enough": (
        [(10, spec(dependencies=(dep("afterok", 7), dep("afterany", 8)), dependency_any=True))],
        Facts(jobs={7: QUEUED, 8: FAILED}),
        {},
    ),
    "with '?' an impossible term still leaves the others to wait for": (
        [(10, spec(dependencies=(dep("afterok", 7), dep("afterany", 8)), dependency_any=True))],
        Facts(jobs={7: FAILED, 8: QUEUED}),
        {10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterok:7, afterany:8")},
    ),
    "with '?' every term impossible can never be met": (
        [(10, spec(dependencies=(dep("afterok", 7), dep("afternotok", 8)), dependency_any=True))],
        Facts(jobs={7: FAILED, 8: OK}),
        {
            10: waiting(
                Waiting.DEPENDENCY_NEVER_SATISFIED,
                "DependencyNeverSatisfied: afterok:7, afternotok:8 can no longer be met",
            )
        },
    ),
    "singleton waits for an earlier live job of the same user and name": (
        [
            (10, spec(name="train", dependencies=(Dependency(kind="singleton"),))),
            (11, spec(name="train", user="bob", dependencies=(Dependency(kind="singleton"),))),
        ],
        Facts(first_live={("ada", "train"): 4, ("bob", "train"): 11}),
        {10: waiting(Waiting.SINGLETON, "Dependency: waiting for singleton (job 4)")},
    ),
    "a singleton with another open term is a plain dependency wait": (
        [(10, spec(name="t", dependencies=(Dependency(kind="singleton"), dep("afterok", 7))))],
        Facts(jobs={7: QUEUED}, first_live={("ada", "t"): 4}),
        {10: waiting(Waiting.DEPENDENCY, "Dependency: waiting for singleton (job 4), afterok:7")},
    ),
    "an array throttle lets the lowest tasks fill the free slots, in id order": (
        [
            (23, spec(array_job_id=20, array_max_running=2)),
            (21, spec(array_job_id=20, array_max_running=2)),
            (22, spec(array_job_id=20, array_max_running=2)),
        ],
        Facts(array_running={20: 1}),
        {
            22: waiting(
                Waiting.JOB_ARRAY_TASK_LIMIT, "JobArrayTaskLimit: 2 of at most 2 tasks running"
            ),
            23: waiting(
                Waiting.JOB_ARRAY_TASK_LIMIT, "JobArrayTaskLimit: 2 of at most 2 tasks running"
            ),
        },
    ),
    "a task blocked by its dependency does not take a throttle slot": (
        [
            (21, spec(array_job_id=20, array_max_running=1, dependencies=(dep("afterok", 7),))),
            (22, spec(array_job_id=20, array_max_running=1)),
        ],
        Facts(jobs={7: QUEUED}),
        {21: waiting(Waiting.DEPENDENCY, "Dependency: waiting for afterok:7")},
    ),
}


@pytest.mark.parametrize(("jobs", "facts", "want"), CASES.values(), ids=CASES.keys())
def test_blockers(jobs: list[tuple[int, JobSpec]], facts: Facts, want: dict[int, Blocker]) -> None:
    assert blockers(jobs, facts, now=T0) == want
