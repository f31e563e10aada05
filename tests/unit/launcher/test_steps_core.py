"""Table tests of a job step's task layout, per-task environment and ending
(services/launcher/steps_core.py), srun's argv split (muster/steps.py) and the step
grant (shared/agent_auth.py)."""

from __future__ import annotations

import time

import msgspec
import pytest

from muster.srun_error import SrunError
from muster.steps import parse, step_request
from services.launcher.steps_core import (
    Layout,
    Refusal,
    StepShape,
    bad_end,
    layout,
    step_end,
    task_env,
    with_job_gpus,
    with_job_tasks,
)
from shared.agent_auth import GrantSigner, check
from shared.api import StepLaunch, StepStop
from shared.bus_inbox import is_users_pty
from shared.identity import Signer, encode_seed

NODES = ("n0", "n1", "n2")
GPUS = {"n0": [0, 1, 2, 3], "n1": [4, 5, 6, 7], "n2": [0, 1]}


def _shape(lay: Layout) -> list[tuple[int, int, int, str, tuple[int, ...]]]:
    return [(t.procid, t.localid, t.nodeid, t.node, t.gpus) for t in lay.tasks]


@pytest.mark.parametrize(
    ("shape", "per_node"),
    [
        (StepShape(), (1, 1, 1)),  # one task per node, every node
        (StepShape(nodes=2), (1, 1)),
        (StepShape(ntasks=2), (1, 1)),  # -n 2: two nodes, one each
        (StepShape(ntasks=5), (2, 2, 1)),  # blocks, the first nodes one more
        (StepShape(nodes=1, ntasks=3), (3,)),
        (StepShape(ntasks_per_node=2), (2, 2, 2)),
        (StepShape(nodes=2, ntasks_per_node=3), (3, 3)),
        (StepShape(ntasks=3, ntasks_per_node=2), (2, 1)),
        (StepShape(nodes=3, ntasks=6, ntasks_per_node=2), (2, 2, 2)),
    ],
)
def test_layout_counts(shape: StepShape, per_node: tuple[int, ...]) -> None:
    lay = layout(shape, NODES, GPUS)
    assert isinstance(lay, Layout)
    assert lay.per_node() == per_node
    assert lay.nodes == NODES[: len(per_node)]
    assert [t.procid for t in lay.tasks] == list(range(sum(per_node)))


JOB_TASKS = {
    "srun alone runs the job's tasks per node": (StepShape(), 2, (2, 2, 2)),
    "-N takes that many nodes of them": (StepShape(nodes=1), 2, (2,)),
    "-n is srun's own count": (StepShape(ntasks=2), 4, (1, 1)),
    "--ntasks-per-node is srun's own": (StepShape(ntasks_per_node=1), 4, (1, 1, 1)),
    "a job of one task a node changes nothing": (StepShape(), 1, (1, 1, 1)),
}  # fmt: skip


@pytest.mark.parametrize(("shape", "job", "per_node"), JOB_TASKS.values(), ids=JOB_TASKS.keys())
def test_srun_without_a_count_runs_the_jobs_tasks_per_node(
    shape: StepShape, job: int, per_node: tuple[int, ...]
) -> None:
    lay = layout(with_job_tasks(shape, job), NODES, GPUS)
    assert isinstance(lay, Layout)
    assert lay.per_node() == per_node


JOB_GPUS = {
    "srun alone binds each task to the job's GPUs per task": (
        StepShape(ntasks_per_node=2), 1, [(0,), (1,), (4,), (5,), (0,), (1,)]
    ),
    "two a task": (StepShape(nodes=2, ntasks_per_node=2), 2, [(0, 1), (2, 3), (4, 5), (6, 7)]),
    "srun's own --gpus-per-task wins": (StepShape(nodes=1, gpus_per_task=2), 1, [(0, 1)]),
    "so does its --gpus-per-node": (StepShape(nodes=1, gpus_per_node=4), 1, [(0, 1, 2, 3)]),
    "and its --gpus": (StepShape(nodes=1, gpus=3), 1, [(0, 1, 2)]),
    "a job that asked none: every task sees its node's GPUs": (
        StepShape(nodes=1, ntasks_per_node=2), None, [(0, 1, 2, 3), (0, 1, 2, 3)]
    ),
}  # fmt: skip


@pytest.mark.parametrize(("shape", "job", "gpus"), JOB_GPUS.values(), ids=JOB_GPUS.keys())
def test_srun_without_a_gpu_option_binds_the_jobs_gpus_per_task(
    shape: StepShape, job: int | None, gpus: list[tuple[int, ...]]
) -> None:
    lay = layout(with_job_gpus(shape, job), NODES, GPUS)
    assert isinstance(lay, Layout), lay
    assert [t.gpus for t in lay.tasks] == gpus


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (StepShape(nodes=4), "-N 4: the allocation has 3 nodes"),
        (StepShape(nodes=3, ntasks=2), "-n 2 is fewer tasks than -N 3 nodes"),
        (StepShape(nodes=1, ntasks=3, ntasks_per_node=2), "does not fit 1 node(s)"),
        (StepShape(nodes=3, gpus_per_task=3, ntasks_per_node=1), "needs 3 GPUs on n2"),
    ],
)
def test_layout_refusals(shape: StepShape, message: str) -> None:
    lay = layout(shape, NODES, GPUS)
    assert isinstance(lay, Refusal)
    assert message in lay.message


def test_gpus_per_task_binds_each_task_its_own_gpus() -> None:
    lay = layout(StepShape(nodes=2, ntasks_per_node=2, gpus_per_task=2), NODES, GPUS)
    assert isinstance(lay, Layout)
    assert _shape(lay) == [
        (0, 0, 0, "n0", (0, 1)),
        (1, 1, 0, "n0", (2, 3)),
        (2, 0, 1, "n1", (4, 5)),
        (3, 1, 1, "n1", (6, 7)),
    ]


def test_without_gpus_per_task_a_task_sees_the_jobs_gpus_on_its_node() -> None:
    lay = layout(StepShape(nodes=2), NODES, GPUS)
    assert isinstance(lay, Layout)
    assert [t.gpus for t in lay.tasks] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_task_env() -> None:
    lay = layout(StepShape(ntasks=3, nodes=2), NODES, GPUS)
    assert isinstance(lay, Layout)
    base = {"SLURM_JOB_ID": "7", "HOME": "/home/a", "SLURMD_NODENAME": "n0"}
    env = task_env(base, lay, lay.tasks[2], job_id=7, step_id=1)
    assert env["HOME"] == "/home/a"
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == ("2", "0", "1")
    assert (env["SLURM_STEP_ID"], env["SLURM_NTASKS"], env["SLURM_STEP_NUM_NODES"]) == (
        "1",
        "3",
        "2",
    )
    assert env["SLURMD_NODENAME"] == "n1"
    assert env["SLURM_STEP_TASKS_PER_NODE"] == env["SLURM_TASKS_PER_NODE"] == "2,1"
    assert env["SLURM_STEP_NODELIST"] == "n[0-1]"
    assert env["CUDA_VISIBLE_DEVICES"] == env["GPU_DEVICE_ORDINAL"] == "4,5,6,7"
    assert env["SLURM_STEP_GPUS"] == "4,5,6,7"


def test_a_steps_gpus_on_a_node_are_every_task_there() -> None:
    lay = layout(StepShape(nodes=1, ntasks=2, gpus_per_task=1), NODES, GPUS, {"n0": {0}})
    assert isinstance(lay, Layout)
    envs = [task_env({}, lay, t, job_id=7, step_id=0) for t in lay.tasks]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["1", "2"]
    assert {e["SLURM_STEP_GPUS"] for e in envs} == {"1,2"}


OK, TERM, SEGV = (0, None), (None, 15), (None, 11)
STEP_ENDS = {
    "every task exited 0": ([OK, OK], [False, False], False, ("COMPLETED", 0, None)),
    "one exited 3": ([OK, (3, None)], [False, False], False, ("FAILED", 3, None)),
    "srun's Ctrl-C: every task stopped": (
        [TERM, TERM],
        [True, True],
        False,
        ("CANCELLED", 143, 15),
    ),
    "a stop that found a task already ended 0": (
        [OK, TERM],
        [False, True],
        False,
        ("CANCELLED", 143, 15),
    ),
    "a lost node": ([OK], [False], True, ("CANCELLED", 0, None)),
    "nothing heard": ([], [], False, ("COMPLETED", None, None)),
    # a task that died by itself by a signal failed: the step is not "cancelled"
    "a segfault": ([OK, SEGV], [False, False], False, ("FAILED", 139, 11)),
    # srun -K: the others were stopped for the first bad end, which is what is reported
    "-K after an exit 4": (
        [(4, None), TERM, TERM],
        [False, True, True],
        False,
        ("FAILED", 4, None),
    ),
    "-K after a segfault": ([SEGV, TERM], [False, True], False, ("FAILED", 139, 11)),
    # a task killed from outside, not stopped by the step (its job ended, a kill)
    "killed from outside": ([OK, (None, 9)], [False, False], False, ("CANCELLED", 137, 9)),
    # a task that handles the stop's SIGTERM and exits 1 was still stopped
    "a stopped task's own exit": ([(1, None), TERM], [True, True], False, ("CANCELLED", 143, 15)),
    # an older agent says nothing: SIGTERM is a stop, a crash a failure
    "an older agent, a signal": ([TERM, OK], [None, None], False, ("CANCELLED", 143, 15)),
    "an older agent, a crash": ([SEGV, OK], [None, None], False, ("FAILED", 139, 11)),
    "an older agent, -K": ([(4, None), TERM], [None, None], False, ("FAILED", 4, None)),
}


@pytest.mark.parametrize(
    ("tasks", "stopped", "lost", "end"), STEP_ENDS.values(), ids=STEP_ENDS.keys()
)
def test_step_ending(
    tasks: list[tuple[int | None, int | None]],
    stopped: list[bool | None],
    lost: bool,
    end: tuple[str, int | None, int | None],
) -> None:
    codes, signals = [c for c, _ in tasks], [s for _, s in tasks]
    got = step_end(codes, signals, stopped, lost)
    assert (got.state, got.exit_code, got.signal) == end


@pytest.mark.parametrize(
    ("argv", "opts", "command"),
    [
        (["hostname"], {}, ["hostname"]),
        (["-N", "2", "hostname", "-f"], {"nodes": "2"}, ["hostname", "-f"]),
        (["-N2", "-n4", "-l", "cmd"], {"nodes": "2", "ntasks": "4", "label": "1"}, ["cmd"]),
        (["--ntasks-per-node=2", "--", "-x"], {"ntasks_per_node": "2"}, ["-x"]),
        (["--gpus-per-task", "h100:1", "-J", "x", "cmd"], {"gpus_per_task": "h100:1"}, ["cmd"]),
        (["--pty", "bash"], {"pty": "1"}, ["bash"]),
        (["--tasks-per-node=2", "--exact", "-X", "-A", "ml", "x"], {"ntasks_per_node": "2"}, ["x"]),
        (["-D", "run", "x"], {"chdir": "run"}, ["x"]),
    ],
)
def test_srun_argv_split(argv: list[str], opts: dict[str, str], command: list[str]) -> None:
    assert parse(argv) == (opts, command)


def test_srun_request() -> None:
    env = {"SLURM_JOB_ID": "12", "MUSTER_USER": "alice"}
    req = step_request(["-n", "3", "--gpus-per-task=h100:1", "echo", "hi"], env, "/w")
    assert (req.job_id, req.ntasks, req.gpus_per_task, req.argv) == (12, 3, 1, ("echo", "hi"))
    assert req.output_dir.startswith("/w/.muster-steps/12-")
    assert req.workdir == "/w"
    assert step_request(["-D", "run", "x"], env, "/w").workdir == "/w/run"  # --chdir
    assert step_request(["--chdir=/data", "x"], env, "/w").workdir == "/data"
    assert req.user == "alice"
    assert req.pty == ""
    pty = step_request(["--pty", "bash"], env, "/w").pty
    # alice's own terminal subject: only she and the agents may use it on a secured bus
    assert pty.startswith("muster.pty.alice.") and len(pty) == len("muster.pty.alice.") + 32
    assert is_users_pty("alice", pty) and not is_users_pty("bob", pty)


@pytest.mark.parametrize(
    ("argv", "per_node", "total"),
    [
        (["--gres=gpu:2"], 2, 0),
        (["--gres", "gpu:a100:2,nvme:1"], 2, 0),  # another gres: said, ignored
        (["--gres=gpu"], 1, 0),
        (["--gres=none"], 0, 0),
        (["--gpus-per-node=h100:3"], 3, 0),
        (["-G4"], 0, 4),
        (["--gpus=2"], 0, 2),
    ],
)
def test_srun_gpus_per_node_and_in_total(argv: list[str], per_node: int, total: int) -> None:
    req = step_request([*argv, "true"], {"SLURM_JOB_ID": "3"}, "/w")
    assert (req.gpus_per_node, req.gpus, req.gpus_per_task) == (per_node, total, 0)


def test_srun_output_asks_for_the_answer_as_the_step_is_made() -> None:
    env = {"SLURM_JOB_ID": "3"}
    assert parse(["-oout-%t", "-e", "e", "x"]) == ({"output": "out-%t", "error": "e"}, ["x"])
    assert step_request(["--output=o", "x"], env, "/w").answer_made
    assert step_request(["--pty", "sh"], env, "/w").answer_made
    assert not step_request(["x"], env, "/w").answer_made  # answered when it ends, or in 5 s


def test_srun_gres_and_gpus_per_node_together_are_refused() -> None:
    with pytest.raises(SrunError, match="give one"):
        step_request(["--gres=gpu:1", "--gpus-per-node=1", "true"], {"SLURM_JOB_ID": "3"}, "/w")
    with pytest.raises(SrunError, match="invalid --gres 'gpu:a:b:c'"):
        step_request(["--gres=gpu:a:b:c", "true"], {"SLURM_JOB_ID": "3"}, "/w")


PTY_SUBJECTS = {
    "the user's own": ("alice", "muster.pty.alice." + "ab" * 16, True),
    "another user's": ("bob", "muster.pty.alice." + "ab" * 16, False),
    "a wildcard": ("alice", "muster.pty.alice.*", False),
    "too short": ("alice", "muster.pty.alice.abcd", False),
    "not hex": ("alice", "muster.pty.alice." + "zz" * 16, False),
    "no user token": ("alice", "muster.pty." + "ab" * 16, False),
    "a dotted user, in hex": ("j.doe", "muster.pty.~6a2e646f65." + "00" * 16, True),
    "a dotted user spelt as tokens": ("j.doe", "muster.pty.j.doe." + "00" * 16, False),
}


@pytest.mark.parametrize(("user", "subject", "ok"), PTY_SUBJECTS.values(), ids=PTY_SUBJECTS.keys())
def test_a_terminal_subject_is_the_users_own(user: str, subject: str, ok: bool) -> None:
    assert is_users_pty(user, subject) is ok


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["hostname"], {}, "not inside a job"),
        ([], {"SLURM_JOB_ID": "1"}, "no command"),
        (["--bogus", "x"], {"SLURM_JOB_ID": "1"}, "unrecognized option '--bogus'"),
        (["-N"], {"SLURM_JOB_ID": "1"}, "requires an argument"),
        (["-N", "two", "x"], {"SLURM_JOB_ID": "1"}, "invalid --nodes value 'two'"),
        (["--pty", "-o", "x.out", "sh"], {"SLURM_JOB_ID": "1"}, "a terminal's output"),
        (["--open-mode=keep", "x"], {"SLURM_JOB_ID": "1"}, "append or truncate"),
    ],
)
def test_srun_refusals(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SrunError, match=message.replace("(", r"\(")):
        step_request(argv, env, "/w")


def test_a_step_grant_is_its_own_verb_and_checked_like_a_start() -> None:
    signer = GrantSigner(Signer(encode_seed(b"\x01" * 32)))
    launch = StepLaunch(
        job_id=1, attempt=0, generation=0, step_id=0, argv=("true",), tasks=(), workdir="/"
    )
    signed = signer.sign(launch, "n0", now=time.time())
    assert signed.token is not None and signed.token.grant.verb == "step"
    trusted = frozenset({signer.public_key})
    assert check(signed, node="n0", trusted=trusted, now=time.time()) is None
    other = check(signed, node="n1", trusted=trusted, now=time.time())
    assert other is not None and other.code == "wrong_node"
    altered = msgspec.structs.replace(signed, argv=("rm", "-rf", "/"))
    refusal = check(altered, node="n0", trusted=trusted, now=time.time())
    assert refusal is not None and refusal.code == "altered"
    stop = StepStop(job_id=1, attempt=0, generation=0, output_dir="/w/x")
    signed_stop = signer.sign(stop, "n0", now=time.time())
    assert signed_stop.token is not None and signed_stop.token.grant.verb == "step_stop"
    assert check(signed_stop, node="n0", trusted=trusted, now=time.time()) is None


@pytest.mark.parametrize(
    ("argv", "env", "kill"),
    [
        (["-K", "x"], {}, True),
        (["-K1", "x"], {}, True),
        (["-K0", "x"], {"SLURM_KILL_BAD_EXIT": "1"}, False),  # the option wins
        (["--kill-on-bad-exit", "x"], {}, True),
        (["--kill-on-bad-exit=0", "x"], {}, False),
        (["x"], {"SLURM_KILL_BAD_EXIT": "1"}, True),  # Slurm's variable for it
        (["x"], {}, False),
    ],
)
def test_srun_kill_on_bad_exit(argv: list[str], env: dict[str, str], kill: bool) -> None:
    req = step_request(argv, {"SLURM_JOB_ID": "7"} | env, "/w")
    assert (req.kill_on_bad_exit, req.argv) == (kill, ("x",))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-K2", "x"], "invalid -K value '2': 0 or 1"),
        (["--kill-on-bad-exit=yes", "x"], "invalid --kill-on-bad-exit value 'yes': 0 or 1"),
        (["--pty=1", "x"], "option '--pty' takes no value"),
    ],
)
def test_srun_flag_values_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SrunError) as refused:
        parse(argv)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("codes", "signals", "bad"),
    [
        ([0, 0], [None, None], False),
        ([0, None], [None, None], False),  # not ended yet is not bad
        ([0, 4], [None, None], True),
        ([None], [11], True),
    ],
)
def test_a_bad_end_is_a_nonzero_exit_or_a_signal(
    codes: list[int | None], signals: list[int | None], bad: bool
) -> None:
    assert bad_end(codes, signals) is bad


def test_srun_takes_a_ddp_launch_lines_binding_hints_and_leaves_them() -> None:
    """`srun --mpi=pmix --cpu-bind=cores -m block:block ...`: accepted (the job's cgroup
    and CUDA_VISIBLE_DEVICES place the tasks), the command and -K kept. Before, the
    first such option failed the step, and with it the job's script."""
    argv = ["--mpi=pmix", "--cpu-bind=cores", "--gpu-bind", "closest", "-mblock:block",
            "--hint=nomultithread", "-Q", "--kill-on-bad-exit=1", "python", "train.py"]  # fmt: skip
    assert parse(argv) == ({"kill_on_bad_exit": "1"}, ["python", "train.py"])
