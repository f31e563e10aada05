"""The `scontrol update` shim's core (muster/scontrol_update.py): Slurm's words for a
job's change read into the request, anything this shim does not change refused with
what to write instead."""

from __future__ import annotations

import pytest

from muster.scontrol_update import (
    NodeUpdate,
    UpdateError,
    is_node_update,
    node_update,
    update_request,
)
from shared.api import UpdateRequest


@pytest.mark.parametrize(
    ("words", "want"),
    [
        (["JobId=12", "TimeLimit=2:00:00"], UpdateRequest(user="u", job_refs=("12",),
                                                          time_limit_s=7200)),
        (["jobid=12,13_4", "nice=10", "Name=x", "Comment=a b"],
         UpdateRequest(user="u", job_refs=("12", "13_4"), nice=10, name="x", comment="a b")),
        (["JobName=y", "JOBID=7", "TimeLimit=30"],
         UpdateRequest(user="u", job_refs=("7",), name="y", time_limit_s=1800)),
        (["JobId=7", "Nice=-5"], UpdateRequest(user="u", job_refs=("7",), nice=-5)),
        # Slurm's relative limits: a change of each job's own
        (["JobId=7", "TimeLimit=+30"],
         UpdateRequest(user="u", job_refs=("7",), time_limit_change_s=1800)),
        (["JobId=7", "TimeLimit=-1:00:00"],
         UpdateRequest(user="u", job_refs=("7",), time_limit_change_s=-3600)),
        # a pending job's placement (admission checks it as a submission)
        (["JobId=7", "Partition=large", "QOS=high", "NumNodes=2-4", "Gres=gpu:8",
          "ExcNodeList=node[01-02]", "Features=a100"],
         UpdateRequest(user="u", job_refs=("7",), partition="large", qos="high", nodes="2-4",
                       gpus_per_node=8, exclude="node[01-02]", constraint="a100")),
        (["JobId=7", "ExcNodeList=", "Features="],
         UpdateRequest(user="u", job_refs=("7",), exclude="", constraint="")),
        (["JobId=7", "StartTime=now+1hour", "Dependency=afterok:5"],
         UpdateRequest(user="u", job_refs=("7",), begin="now+1hour", dependency="afterok:5")),
        (["JobId=7", "ReqNodeList=node[03-04]", "Account=prod"],
         UpdateRequest(user="u", job_refs=("7",), nodelist="node[03-04]", account="prod")),
        (["JobId=7", "NodeList="], UpdateRequest(user="u", job_refs=("7",), nodelist="")),
        (["JobId=8", "ArrayTaskThrottle=2"],
         UpdateRequest(user="u", job_refs=("8",), array_throttle=2)),
    ],
)  # fmt: skip
def test_slurms_words_for_a_jobs_change(words: list[str], want: UpdateRequest) -> None:
    assert update_request(words, "u") == want


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["TimeLimit=1:00:00"], "say which job: JobId=123"),
        (["JobId=1", "TimeLimit=+soon"], "invalid TimeLimit= '+soon': expected + or - then"),
        (["JobId=1", "TimeLimit=-0"], "invalid TimeLimit= '-0': expected + or - then"),
        (["JobId=1", "TimeLimit=UNLIMITED"], "invalid TimeLimit= 'UNLIMITED': give a limit above"),
        (["JobId=1", "TimeLimit=soon"], "invalid TimeLimit= 'soon'"),
        (["JobId=1", "Nice=lots"], "invalid Nice= 'lots'"),
        (["JobId=1", "MinMemoryNode=8G"], "MinMemoryNode= is what the job is placed by"),
        (["JobId=1", "NumTasks=4"], "NumTasks= is what the job is placed by"),
        (["JobId=1", "ArrayTaskThrottle=two"], "ArrayTaskThrottle=two: a number of tasks, 0 for"),
        (["JobId=1", "Gres=gpu:a100:2"], "Gres=gpu:a100:2: this shim changes the GPUs per"),
        (["JobId=1", "Gres=nic:1"], "Gres=nic:1: this shim changes the GPUs per node alone"),
        (["JobId=1", "Hold"], "Hold: write Key=Value"),
        (["JobId=1", "Color=red"], "Color=red: unknown to this shim; it changes JobId=,"),
    ],
)
def test_what_the_shim_does_not_change_is_refused_with_what_to_write(
    words: list[str], said: str
) -> None:
    with pytest.raises(UpdateError) as err:
        update_request(words, "u")
    assert str(err.value).startswith(said), str(err.value)


@pytest.mark.parametrize(
    ("words", "want"),
    [
        (["NodeName=node[01-02]", "State=DRAIN", "Reason=bad riser"],
         NodeUpdate(verb="drain", nodes=("node01", "node02"), reason="bad riser")),
        (["nodename=node03", "state=resume"],
         NodeUpdate(verb="resume", nodes=("node03",), reason="resumed by scontrol")),
        (["NodeName=node03", "State=UNDRAIN", "Reason=fixed"],
         NodeUpdate(verb="resume", nodes=("node03",), reason="fixed")),
    ],
)  # fmt: skip
def test_slurms_words_for_a_nodes_drain(words: list[str], want: NodeUpdate) -> None:
    assert is_node_update(words)
    assert node_update(words) == want


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["NodeName=node01", "State=DRAIN"], 'a drain says why: add Reason="..."'),
        (["NodeName=node01", "State=DOWN", "Reason=x"], "State=DOWN is not taken by hand"),
        (["NodeName=node01", "State=IDLE"], "State=IDLE: give State=DRAIN or State=RESUME"),
        (["NodeName=node01"], "State=(none): give State=DRAIN or State=RESUME"),
        (["NodeName=node[01", "State=RESUME"], "NodeName=node[01: invalid hostlist"),
        (["NodeName=node01", "Weight=5"], "Weight=5: unknown to this shim; for a node"),
        (["NodeName=node01", "Drain"], "Drain: write Key=Value"),
    ],
)
def test_a_node_update_this_shim_does_not_make_says_what_to_write(
    words: list[str], said: str
) -> None:
    with pytest.raises(UpdateError) as err:
        node_update(words)
    assert str(err.value).startswith(said), str(err.value)


def test_a_job_update_is_not_a_node_update() -> None:
    assert not is_node_update(["JobId=1", "TimeLimit=30"])
    assert not is_node_update([])
