"""Table test: seff's report of a job's accounting record (muster/seff.py): memory
utilized and its efficiency against --mem, in the lines of Slurm's seff."""

from __future__ import annotations

import pytest

from muster.seff import seff_lines, size_words
from services.fairshare.render import AcctRow

GIB = 2**30


def row(**kw: object) -> AcctRow:
    base: dict[str, object] = {
        "job_id": 12, "user": "ada", "account": "ml", "state": "COMPLETED", "exit_code": 0,
        "start": 1000.0, "end": 1000.0 + 3723, "nodes": ("node01",), "cpus": 8,
        "mem_mib": 40960, "max_rss_bytes": 3 * GIB, "max_rss_node": "node01",
        "cpu_usec": 1_861_500_000,
    }  # fmt: skip
    return AcctRow(**(base | kw))  # type: ignore[arg-type]


def test_a_job_that_used_a_part_of_its_memory() -> None:
    assert seff_lines(row(), "ml", "muster", now=9e9) == [
        "Job ID: 12",
        "Cluster: muster",
        "User/Group: ada/ml",
        "State: COMPLETED (exit code 0)",
        "Nodes: 1",
        "Cores per node: 8",
        "CPU Utilized: 00:31:01",
        "CPU Efficiency: 6.25% of 08:16:24 core-walltime",
        "Job Wall-clock time: 01:02:03",
        "Memory Utilized: 3.00 GB",
        "Memory Efficiency: 7.50% of 40.00 GB",
    ]


CASES = {
    "several nodes: the peak times its nodes, an estimated maximum": (
        row(nodes=("node01", "node02"), cpus=16),
        ["Cores per node: 8", "Memory Utilized: 6.00 GB (estimated maximum)",
         "Memory Efficiency: 7.50% of 80.00 GB"],
    ),
    "no --mem asked: nothing to measure it against": (
        row(mem_mib=0),
        ["Memory Utilized: 3.00 GB", "Memory Efficiency: not known (no --mem asked)"],
    ),
    "no peak recorded (no cgroup, or not ended)": (
        row(max_rss_bytes=None, cpu_usec=None),
        ["Memory Utilized: not recorded (no memory cgroup on its nodes, or it has not ended)",
         "Memory Efficiency: not known",
         "CPU Utilized: not recorded (no cgroup on its nodes, or it has not ended)",
         "CPU Efficiency: not known"],
    ),
    "several nodes: CPU time of them all against every node's CPUs": (
        row(nodes=("node01", "node02"), cpus=16, cpu_usec=3_723_000_000),
        ["CPU Utilized: 01:02:03", "CPU Efficiency: 6.25% of 16:32:48 core-walltime"],
    ),
    "a running job: its time so far, and seff's warning": (
        row(state="RUNNING", exit_code=None, end=None, max_rss_bytes=None),
        ["State: RUNNING", "Job Wall-clock time: 00:00:10",
         "WARNING: Efficiency statistics may be misleading for RUNNING jobs."],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("record", "want"), CASES.values(), ids=CASES.keys())
def test_seff(record: AcctRow, want: list[str]) -> None:
    got = seff_lines(record, "ml", "muster", now=1010.0)
    assert [line for line in want if line not in got] == [], got


@pytest.mark.parametrize(
    ("kib", "want"),
    [(0, "0.00 MB"), (512, "512.00 KB"), (1536, "1.50 MB"), (3 * 2**20, "3.00 GB"),
     (5 * 2**30, "5.00 TB")],
)  # fmt: skip
def test_sizes_are_written_in_the_largest_whole_unit(kib: int, want: str) -> None:
    assert size_words(kib) == want
