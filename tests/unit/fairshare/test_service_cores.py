"""The service's pure helpers: the cluster file's fair-share view, acct records, and
share-table filters."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.fairshare.acct import acct_rows
from services.fairshare.cluster import read_cluster
from services.fairshare.core import compute_shares
from services.fairshare.render import AcctRow
from services.fairshare.service import filter_share_rows
from services.fairshare.tree import Account, UserAssoc, check_tree
from shared.jobspec import JobSpec
from tests.unit.fairshare.builders import SLURM_CLASSIC_TREE, used

REPO = Path(__file__).resolve().parents[3]


def test_the_local_cluster_file_gives_a_sound_70_30_tree_and_billing_weights() -> None:
    view = read_cluster((REPO / "deploy" / "local" / "cluster.toml").read_text())

    assert view.tree.accounts == (
        Account(name="research", shares=70),
        Account(name="prod", shares=30),
    )
    assert UserAssoc(user="bob", account="prod") in view.tree.users
    assert check_tree(view.tree) == ()
    assert view.billing_weights["H100"] == 2.0
    assert view.qos_priorities == {"high": 1000, "normal": 100, "low": 0}


def test_a_broken_cluster_file_says_so() -> None:
    with pytest.raises(ValueError, match="not valid TOML"):
        read_cluster("[accounts.x\n")


SPEC = msgspec.json.encode(
    JobSpec(user="ada", script="x", gpus_per_node=4, nodes_max=2, cpus_per_task=4, mem_mib=40960)
)
JOB = {
    "job_id": 12,
    "name": "train",
    "user_name": "ada",
    "account": "physics",
    "partition": "gpu",
    "spec": SPEC,
    "submit": 100.0,
    "cancelled": False,
    "state": "COMPLETED",
    "current_attempt": 2,
    "exit_code": 0,
    "run_nodes": ["n2"],
    "run_start": 110.0,
    "run_end": 400.0,
    "max_rss": 3 * 2**30,  # the current attempt's highest peak, and where
    "max_rss_node": "n2",
    "cpu_usec": 5_000_000,  # and the CPU time of its workers on every node
}
ATTEMPTS = [
    {"job_id": 12, "attempt": a, "allocated": s - 1, "released": e, "gpus": g, "nodes": n,
     "started": s, "ended": e, "max_rss": rss, "max_rss_node": n[0],
     "cpu_usec": 5_000_000 if a == 2 else None}
    for a, s, e, g, n, rss in (
        (1, 110.0, 200.0, 8, ["n1", "n2"], 2**30), (2, 210.0, 400.0, 4, ["n2"], 3 * 2**30)
    )
]  # fmt: skip
CHARGES = [
    {"job_id": 12, "attempt": 1, "charged": 720.0, "billed": 1440.0, "gpu_model": "H100"},
    {"job_id": 12, "attempt": 2, "charged": 760.0, "billed": 1520.0, "gpu_model": "H100"},
]


def test_acct_gives_the_job_then_each_attempt_an_earlier_one_requeued() -> None:
    rows = acct_rows([JOB], ATTEMPTS, CHARGES, per_attempt=True)

    base = AcctRow(
        job_id=12, name="train", user="ada", account="physics", partition="gpu",
        state="COMPLETED", gpus=4, gpu_model="H100", submit=100.0, start=110.0, end=400.0,
        gpu_seconds=1480.0, billed=2960.0, exit_code=0, nodes=("n2",),
        mem_mib=40960, cpus=4, max_rss_bytes=3 * 2**30, max_rss_node="n2", cpu_usec=5_000_000,
    )  # fmt: skip
    assert rows == [
        base,
        msgspec.structs.replace(
            base,
            attempt=1,
            state="REQUEUED",
            gpus=8,
            end=200.0,
            gpu_seconds=720.0,
            billed=1440.0,
            exit_code=None,
            nodes=("n1", "n2"),
            cpus=8,  # 4 on each of its two nodes
            max_rss_bytes=2**30,
            max_rss_node="n1",
            cpu_usec=None,  # none recorded for it
        ),
        msgspec.structs.replace(base, attempt=2, start=210.0, gpu_seconds=760.0, billed=1520.0),
    ]


def test_acct_lists_each_srun_step_after_the_job_as_sacct_does() -> None:
    steps = [  # as read from job_steps, in any order
        {"job_id": 12, "step_id": 1, "argv": ["false"], "nodes": ["n2"], "ntasks": 1,
         "state": "FAILED", "exit_code": 1, "gpus": "{}", "started": 300.0, "ended": 301.0},
        {"job_id": 12, "step_id": 0, "argv": ["/usr/bin/python3", "train.py"],
         "nodes": ["n2"], "ntasks": 2, "state": "COMPLETED", "exit_code": 0,
         "gpus": '{"n2": [0, 1]}', "started": 220.0, "ended": 290.0},
        {"job_id": 99, "step_id": 0, "argv": ["x"], "nodes": [], "ntasks": 1,
         "state": "COMPLETED", "exit_code": 0, "gpus": "{}", "started": 1.0, "ended": 2.0},
    ]  # fmt: skip
    job, first, second = acct_rows([JOB], ATTEMPTS, CHARGES, steps=steps)
    assert (job.step, job.attempt, job.state) == (None, None, "COMPLETED")
    assert first == AcctRow(
        job_id=12, step=0, name="python3", user="ada", account="physics", partition="gpu",
        state="COMPLETED", gpus=2, gpu_model="H100", start=220.0, end=290.0, exit_code=0,
        nodes=("n2",),
    )  # fmt: skip
    assert (second.step, second.name, second.state, second.exit_code, second.gpus) == (
        1,
        "false",
        "FAILED",
        1,
        0,
    )


def test_acct_of_a_job_never_run_is_pending_with_its_requested_gpus() -> None:
    job = {**JOB, "state": None, "current_attempt": None, "exit_code": None,
           "run_nodes": None, "run_start": None, "run_end": None}  # fmt: skip
    (row,) = acct_rows([job], [], [], per_attempt=True)
    assert (row.state, row.gpus, row.gpu_seconds, row.start) == ("PENDING", 8, 0.0, None)
    assert acct_rows([job], [], [], states=("completed",)) == []


def test_share_rows_filter_to_named_accounts_and_users_keeping_root() -> None:
    rows = compute_shares(SLURM_CLASSIC_TREE, used(u2__C=1.0)).rows

    got = filter_share_rows(rows, ("C",), ("u3",))

    assert [(r.account, r.user) for r in got] == [("root", None), ("C", None), ("C", "u3")]
    assert filter_share_rows(rows, (), ()) == rows
