"""Pure: what `muster update` (scontrol update job) may change of the selected jobs
(services/admission/update.py), against the shipped configuration: alice owns the
jobs, carol coordinates research, root is an operator."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.admission.actions import Target
from services.admission.config import load_config
from services.admission.replan import PlacementChange
from services.admission.update import (
    MAX_TEXT,
    JobChange,
    UpdateDecision,
    UpdateTarget,
    check_change,
    decide_update,
)
from services.admission.values import limit_update, new_time_limit

CONFIG = load_config(
    (Path(__file__).resolve().parents[3] / "deploy" / "local" / "cluster.toml").read_text()
)
HOUR = 3600


def job(
    job_id: int,
    state: str = "PENDING",
    limit: int = HOUR,
    partition: str = "normal",
    array: bool = False,
) -> UpdateTarget:
    target = Target(job_id=job_id, owner="alice", account="research", state=state, in_array=array)
    return UpdateTarget(target=target, time_limit_s=limit, partition=partition, array_task=array)


CASES = {
    "the owner lowers a pending job's limit": (
        "alice", [job(1)], JobChange(time_limit_s=1800),
        UpdateDecision(act_on=(1,), limits=((1, 1800),)),
    ),
    "and gives it a name, a comment and a nice": (
        "alice", [job(1)], JobChange(name="x", comment="y", nice=10), UpdateDecision(act_on=(1,)),
    ),
    "a coordinator of its account may": (
        "carol", [job(1)], JobChange(nice=5), UpdateDecision(act_on=(1,)),
    ),
    "someone else may not": (
        "dave", [job(1)], JobChange(nice=5),
        UpdateDecision(
            refusal="job 1: 'dave' may not modify a job of 'alice' in account 'research':"
            " only its owner, a coordinator of its account, or an operator may",
            code="forbidden",
        ),
    ),
    "only an operator raises a limit": (
        "alice", [job(1)], JobChange(time_limit_s=2 * HOUR),
        UpdateDecision(
            refusal="job 1: only an operator may raise a time limit (01:00:00 now);"
            " ask for 01:00:00 or less",
            code="forbidden",
        ),
    ),
    "an operator raises it, past the partition's maximum too": (
        "root", [job(1, partition="debug")], JobChange(time_limit_s=2 * HOUR),
        UpdateDecision(act_on=(1,), limits=((1, 2 * HOUR),)),
    ),
    "a lower limit still over the partition's maximum (the configuration changed)": (
        "alice", [job(1, limit=2 * HOUR, partition="debug")], JobChange(time_limit_s=HOUR),
        UpdateDecision(
            refusal="job 1: time limit 01:00:00 is over the maximum of partition 'debug':"
            " 00:30:00",
            code="forbidden",
        ),
    ),
    "only an operator gives a negative nice": (
        "alice", [job(1)], JobChange(nice=-5),
        UpdateDecision(
            refusal="job 1: --nice=-5: only an operator may raise a job's priority; use 0"
            " or more",
            code="forbidden",
        ),
    ),
    "the owner lowers a running job's limit: its coordinator re-arms": (
        "alice", [job(1, state="RUNNING"), job(2)], JobChange(time_limit_s=60),
        UpdateDecision(act_on=(1, 2), limits=((1, 60), (2, 60)), rearm=(1,)),
    ),
    "an allocated or starting job's too": (
        "alice", [job(1, state="CONFIGURING"), job(2, state="STARTING")],
        JobChange(time_limit_s=60),
        UpdateDecision(act_on=(1, 2), limits=((1, 60), (2, 60)), rearm=(1, 2)),
    ),
    "a running job's name changes with nothing to re-arm": (
        "alice", [job(1, state="RUNNING")], JobChange(name="renamed"),
        UpdateDecision(act_on=(1,)),
    ),
    "only an operator raises a running job's limit": (
        "carol", [job(1, state="RUNNING")], JobChange(time_limit_s=2 * HOUR),
        UpdateDecision(
            refusal="job 1: only an operator may raise a time limit (01:00:00 now);"
            " ask for 01:00:00 or less",
            code="forbidden",
        ),
    ),
    "an operator raises it": (
        "root", [job(1, state="RUNNING")], JobChange(time_limit_s=2 * HOUR),
        UpdateDecision(act_on=(1,), limits=((1, 2 * HOUR),), rearm=(1,)),
    ),
    "a job being stopped is skipped, saying why, the pending one changed": (
        "alice", [job(1, state="COMPLETING"), job(2)], JobChange(time_limit_s=60),
        UpdateDecision(
            act_on=(2,),
            limits=((2, 60),),
            skipped=("job 1 is COMPLETING; only a pending or running job can be updated"
                     " (one ending or ended is done)",),
        ),
    ),
    "a change of each job's own limit: each its new one": (
        "alice", [job(1, limit=HOUR), job(2, limit=2 * HOUR, state="RUNNING")],
        JobChange(time_limit_change_s=-1800),
        UpdateDecision(act_on=(1, 2), limits=((1, 1800), (2, 5400)), rearm=(2,)),
    ),
    "a raise by a change is an operator's too": (
        "alice", [job(1)], JobChange(time_limit_change_s=60),
        UpdateDecision(
            refusal="job 1: only an operator may raise a time limit (01:00:00 now);"
            " ask for 01:00:00 or less",
            code="forbidden",
        ),
    ),
    "an operator's raise by a change": (
        "root", [job(1, state="RUNNING")], JobChange(time_limit_change_s=HOUR),
        UpdateDecision(act_on=(1,), limits=((1, 2 * HOUR),), rearm=(1,)),
    ),
    "a change that leaves no time: refused, saying why": (
        "root", [job(1, limit=1800)], JobChange(time_limit_change_s=-HOUR),
        UpdateDecision(
            refusal="job 1: its time limit is 00:30:00, and 01:00:00 less is none; give a"
            " smaller change or a whole limit",
            code="invalid",
        ),
    ),
    "a pending job's placement changes; a running one's is placed already: skipped": (
        "alice", [job(1, state="RUNNING"), job(2)],
        JobChange(placement=PlacementChange(partition="large", nodes=(2, 2))),
        UpdateDecision(
            act_on=(2,),
            skipped=("job 1 is RUNNING; its partition, QOS, account, nodes and GPUs are"
                     " placed already: cancel the job and submit it again to change them",),
        ),
    ),
    "a change past UNLIMITED: refused, not written": (
        "root", [job(1, limit=2**31 - 1)], JobChange(time_limit_change_s=60),
        UpdateDecision(
            refusal="job 1: a time limit of 2147483707 s is past UNLIMITED (2147483647 s);"
            " give a smaller one",
            code="invalid",
        ),
    ),
    "nothing pending or running: refused with why": (
        "alice", [job(1, state="COMPLETED")], JobChange(nice=1),
        UpdateDecision(
            refusal="job 1 is COMPLETED; only a pending or running job can be updated"
            " (one ending or ended is done)",
            code="invalid_state",
            skipped=("job 1 is COMPLETED; only a pending or running job can be updated"
                     " (one ending or ended is done)",),
        ),
    ),
    "an array's throttle: its pending and running tasks; ended ones without a word": (
        "alice",
        [job(1, array=True), job(2, "RUNNING", array=True), job(3, "COMPLETED", array=True)],
        JobChange(array_throttle=2), UpdateDecision(act_on=(1, 2)),
    ),
    "a throttle for a job that is not an array task is skipped saying so": (
        "alice", [job(1, array=True), job(4)], JobChange(array_throttle=0),
        UpdateDecision(
            act_on=(1,),
            skipped=("job 4 is not an array task: ArrayTaskThrottle= is an array's",),
        ),
    ),
    "no job selected": (
        "alice", [], JobChange(nice=1),
        UpdateDecision(refusal="no job matches the selection", code="not_found"),
    ),
}  # fmt: skip


@pytest.mark.parametrize(("actor", "targets", "change", "want"), CASES.values(), ids=CASES.keys())
def test_who_may_change_what_of_which_job(
    actor: str, targets: list[UpdateTarget], change: JobChange, want: UpdateDecision
) -> None:
    assert decide_update(actor, targets, change, CONFIG) == want


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (JobChange(), "say what to change: TimeLimit=, Nice=, JobName=, Comment=, Partition="),
        (JobChange(time_limit_s=0), "a time limit is above 0"),
        (JobChange(time_limit_change_s=0), "a change of the time limit is not 0"),
        (
            JobChange(time_limit_s=60, time_limit_change_s=60),
            "give the time limit once: whole (2:00:00) or as a change (+30, -30)",
        ),
        (JobChange(name=" "), "a job's name is not empty"),
        (JobChange(comment="a\nb"), f"a job's comment is one line of at most {MAX_TEXT}"),
        (JobChange(name="x" * (MAX_TEXT + 1)), "a job's name is one line"),
    ],
)
def test_a_change_that_cannot_be_made_says_what_to_write(change: JobChange, said: str) -> None:
    why = check_change(change)
    assert why is not None and why.startswith(said), why
    assert decide_update("root", [job(1)], change, CONFIG).refusal == why


def test_a_change_names_only_the_fields_it_sets() -> None:
    assert JobChange(nice=0, comment="").fields() == {"nice": 0, "comment": ""}
    both = JobChange(time_limit_change_s=60, name="x")
    assert both.fields() == {"time_limit_change_s": 60, "name": "x"}
    assert both.spec_fields() == {"name": "x"}  # each job's limit is its own
    moved = JobChange(nice=1, placement=PlacementChange(partition="large", exclude=""))
    assert moved.fields() == {"nice": 1, "partition": "large", "exclude": ""}
    assert moved.spec_fields() == {"nice": 1} and moved.replans()
    assert not JobChange(nice=1, placement=PlacementChange()).replans()


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2:00:00", (7200, None)),
        ("+30", (None, 1800)),
        ("-1-00:00:00", (None, -86400)),
        (" +0:00:10", (None, 10)),
    ],
)
def test_a_limit_is_written_whole_or_as_a_change(
    text: str, want: tuple[int | None, int | None]
) -> None:
    assert limit_update(text, "--time") == want


@pytest.mark.parametrize(
    ("text", "seconds", "said"),
    [
        ("30", 1800, None),
        ("1-00:00:00", 86400, None),
        ("UNLIMITED", None, "invalid --time 'UNLIMITED': give a limit above 0"),
        ("0", None, "invalid --time '0': give a limit above 0"),
        ("soon", None, "invalid --time 'soon': expected"),
    ],
)
def test_a_new_time_limit_is_a_duration_above_0(
    text: str, seconds: int | None, said: str | None
) -> None:
    """What `muster update --time` and scontrol's `TimeLimit=` both read."""
    if said is None:
        assert new_time_limit(text, "--time") == seconds
        return
    with pytest.raises(ValueError) as err:
        new_time_limit(text, "--time")
    assert str(err.value).startswith(said), str(err.value)


def test_a_throttle_of_0_lifts_it() -> None:
    assert JobChange(array_throttle=0).spec_fields() == {"array_max_running": None}
    assert JobChange(array_throttle=3).spec_fields() == {"array_max_running": 3}
