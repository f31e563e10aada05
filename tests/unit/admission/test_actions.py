"""Pure: which selected jobs a command acts on, job references, and job policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission.actions import Decision, Target, Verb, decide, in_array
from services.admission.config import load_config
from services.admission.policy import JobPolicy, JobRef, job_policy, parse_job_ref
from shared.jobspec import JobSpec
from shared.signal_scope import signal_name

CONFIG = load_config(
    (Path(__file__).resolve().parents[3] / "deploy" / "local" / "cluster.toml").read_text()
)


def job(job_id: int, owner: str = "alice", state: str = "PENDING", **kw: bool) -> Target:
    account = "prod" if owner == "dave" else "research"
    return Target(job_id=job_id, owner=owner, account=account, state=state, **kw)


CASES = {
    "an owner cancels a pending and a running job": (
        Verb.CANCEL, "alice", [job(1), job(2, state="RUNNING")], Decision(act_on=(1, 2)),
    ),
    "an ended job is skipped with its state, the rest acted on": (
        Verb.CANCEL, "alice", [job(1, state="COMPLETED"), job(2)],
        Decision(act_on=(2,), skipped=("job 1 already ended (COMPLETED)",)),
    ),
    "one job of someone else refuses the whole request": (
        Verb.CANCEL, "bob", [job(1, owner="bob"), job(2)],
        Decision(
            refusal="job 2: 'bob' may not cancel a job of 'alice' in account 'research': only "
            "its owner, a coordinator of its account, or an operator may",
            code="forbidden",
        ),
    ),
    "an array named whole: its ended tasks are left alone without a word": (
        Verb.RELEASE, "alice",
        [job(1, state="COMPLETED", in_array=True), job(2, held=True, in_array=True)],
        Decision(act_on=(2,)),
    ),
    "an array whose every task ended says so": (
        Verb.CANCEL, "alice",
        [job(1, state="COMPLETED", in_array=True), job(2, state="FAILED", in_array=True)],
        Decision(
            refusal="job 1 already ended (COMPLETED); job 2 already ended (FAILED)",
            code="invalid_state",
            skipped=("job 1 already ended (COMPLETED)", "job 2 already ended (FAILED)"),
        ),
    ),
    "a coordinator acts on its account's jobs": (
        Verb.HOLD, "carol", [job(1)], Decision(act_on=(1,)),
    ),
    "an operator's hold on another's job is an operator hold": (
        Verb.HOLD, "root", [job(1), job(2, owner="root")],
        Decision(act_on=(1, 2), operator_hold=(1,)),
    ),
    "a running job cannot be held": (
        Verb.HOLD, "alice", [job(1, state="RUNNING")],
        Decision(
            refusal="job 1 is RUNNING; only pending jobs can be held", code="invalid_state",
            skipped=("job 1 is RUNNING; only pending jobs can be held",),
        ),
    ),
    "a user may not release an operator's hold": (
        Verb.RELEASE, "alice", [job(1, held=True, held_by_operator=True)],
        Decision(
            refusal="job 1 was held by an operator; only an operator may release it",
            code="forbidden",
        ),
    ),
    "release does not lift the approval wait": (
        Verb.RELEASE, "alice", [job(1, needs_approval=True)],
        Decision(
            refusal="job 1 is not held; it waits for an operator's approval",
            code="invalid_state",
            skipped=("job 1 is not held; it waits for an operator's approval",),
        ),
    ),
    "approve is for operators": (
        Verb.APPROVE, "carol", [job(1, needs_approval=True)],
        Decision(
            refusal="job 1: only an operator may approve; 'carol' is not an operator",
            code="forbidden",
        ),
    ),
    "signal only reaches running jobs": (
        Verb.SIGNAL, "alice", [job(1), job(2, state="RUNNING")],
        Decision(act_on=(2,), skipped=("job 1 is PENDING, not running: no signal",)),
    ),
    "nothing selected": (
        Verb.CANCEL, "alice", [],
        Decision(refusal="no job matches the selection", code="not_found"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("verb", "actor", "targets", "want"), CASES.values(), ids=CASES.keys())
def test_decide(verb: Verb, actor: str, targets: list[Target], want: Decision) -> None:
    assert decide(verb, actor, targets, CONFIG) == want


REFS = {
    "a plain id": ("123", JobRef(job_id=123)),
    "an array task": ("123_4", JobRef(job_id=123, tasks=(4,))),
    "a task range": ("7_[1-3,9]", JobRef(job_id=7, tasks=(1, 2, 3, 9))),
}


@pytest.mark.parametrize(("text", "want"), REFS.values(), ids=REFS.keys())
def test_parse_job_ref(text: str, want: JobRef) -> None:
    assert parse_job_ref(text) == want


@pytest.mark.parametrize("text", ["", "abc", "12_", "12_x", "12_[3-1]"])
def test_a_bad_job_ref_says_which_forms_work(text: str) -> None:
    with pytest.raises(ValueError, match=r"123_4|backwards|not one of"):
        parse_job_ref(text)


IN_ARRAY = {
    "a job of no array": ([(7, None)], 7, None, None, False),
    "task 3 of array 8, the array named": ([(8, None)], 10, 8, 3, True),
    "the array's first task, the array named by its id": ([(8, None)], 8, 8, 0, True),
    "task 3 of a range": ([(8, (1, 2, 3))], 10, 8, 3, True),
    "task 3 named alone": ([(8, (3,))], 10, 8, 3, False),
    "task 3 named by its own job id": ([(10, None)], 10, 8, 3, False),
    "named alone and with its array": ([(8, None), (8, (3,))], 10, 8, 3, False),
}  # fmt: skip


@pytest.mark.parametrize(
    ("refs", "job_id", "array", "task", "want"), IN_ARRAY.values(), ids=IN_ARRAY.keys()
)
def test_in_array(
    refs: list[tuple[int, tuple[int, ...] | None]],
    job_id: int,
    array: int | None,
    task: int | None,
    want: bool,
) -> None:
    assert in_array(refs, job_id, array, task) is want


def test_signal_names() -> None:
    assert [signal_name(s) for s in ("USR1", "sigterm", "9")] == ["SIGUSR1", "SIGTERM", "SIGKILL"]
    with pytest.raises(ValueError, match="unknown signal"):
        signal_name("FOO")


def test_the_policy_comes_from_the_partition_and_qos() -> None:
    spec = JobSpec(user="alice", script="#!/bin/sh\n", partition="large", qos="normal")
    assert job_policy(spec, CONFIG) == JobPolicy(
        tier=10, preemptible=True, can_preempt=True, grace_s=300, min_runtime_s=600,
        needs_approval=True,
    )  # fmt: skip
    debug = JobSpec(user="alice", script="#!/bin/sh\n", partition="debug", qos="high")
    assert job_policy(debug, CONFIG).preemptible is False
    assert job_policy(debug, None) == JobPolicy()
