"""The sreport shim's core (muster/sreport.py): Slurm's words and options read, its
`cluster AccountUtilizationByUser`, `cluster UserUtilizationByAccount`, `user
TopUsage`, `cluster Utilization` and `job SizesByAccount` reports printed as Slurm
lays them out (fixed columns, -P/-p parsable, -n without headers), anything else
refused with what to write."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from muster.sreport import (
    Report,
    SreportArgs,
    SreportError,
    cluster_lines,
    lines,
    parse,
    sizes_lines,
)
from services.fairshare.cluster_report import ClusterUsage
from services.fairshare.report import ReportRow
from services.fairshare.sizes_report import SizeRow


def when(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


JAN14 = when("2027-01-14")
JAN15 = when("2027-01-15")


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["cluster", "AccountUtilizationByUser"], SreportArgs()),
        (["-P", "-n", "-t", "hours", "cluster", "accountutilizationbyuser",
          "start=2027-01-14", "end=2027-01-15"],
         SreportArgs(unit="hours", delimiter="|", header=False, since=JAN14, until=JAN15)),
        (["-p", "-tseconds", "cluster", "AccountUtilizationByUser", "accounts=a,b", "users=u",
          "tree"],
         SreportArgs(unit="seconds", delimiter="|", trailing=True, accounts=("a", "b"),
                     users=("u",))),
        (["--time-format=Minutes", "--parsable2", "-T", "gres/gpu", "cluster",
          "AccountUtilizationByUser"],
         SreportArgs(delimiter="|")),
        (["cluster", "UserUtilizationByAccount", "users=u"],
         SreportArgs(report=Report.USER_BY_ACCOUNT, users=("u",))),
        (["-t", "hours", "user", "topusage", "TopCount=3", "group", "start=2027-01-14"],
         SreportArgs(report=Report.TOP_USAGE, unit="hours", top_count=3, group=True,
                     since=JAN14)),
        (["-P", "cluster", "Utilization", "start=2027-01-14"],
         SreportArgs(report=Report.UTILIZATION, delimiter="|", since=JAN14)),
        (["job", "SizesByAccount", "grouping=1,8", "printjobcount", "flatview", "accounts=ml"],
         SreportArgs(report=Report.SIZES, grouping=(1, 8), job_count=True, accounts=("ml",))),
    ],
)  # fmt: skip
def test_slurms_words_and_options(argv: list[str], want: SreportArgs) -> None:
    assert parse(argv, when) == want


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["job", "SizesByWckey"], "report job SizesByWckey is not kept: the reports are"),
        (["job", "SizesByAccount", "grouping=8,4"], "grouping '8,4': give increasing GPU"),
        (["job", "SizesByAccount", "users=u"], "users=u: start=, end=, accounts=, grouping="),
        (["user", "TopUsage", "TopCount=0"], "TopCount= takes a whole number"),
        (["cluster", "UserUtilizationByAccount", "tree"], "tree: start=, end=, accounts=, us"),
        ([], "report (none) is not kept"),
        (["cluster", "Utilization", "accounts=a"], "accounts=a: the cluster's report takes"),
        (["-t", "percent", "cluster", "AccountUtilizationByUser"], "-t percent: one of"),
        (["-x", "cluster", "AccountUtilizationByUser"], "unknown option -x"),
        (["-T", "cpu", "cluster", "AccountUtilizationByUser"], "-T cpu: GPU time is what"),
        (["cluster", "AccountUtilizationByUser", "format=Used"], "format=Used: start="),
        (["cluster", "AccountUtilizationByUser", "start=soon"], "start=soon:"),
    ],
)
def test_what_is_not_kept_is_refused_with_what_to_write(argv: list[str], says: str) -> None:
    with pytest.raises(SreportError, match=says.replace("(", r"\(").replace(")", r"\)")):
        parse(argv, when)


ROWS = (
    ReportRow(account="prod", gpu_seconds=1800.0, billed=1800.0, share=0.2),
    ReportRow(account="prod", user="dave", gpu_seconds=1800.0, billed=1800.0, share=0.2),
    ReportRow(account="research", gpu_seconds=7200.0, billed=14400.0, share=0.8),
    ReportRow(account="research", user="alice", gpu_seconds=7200.0, billed=14400.0, share=0.8),
)


def test_the_report_as_slurm_lays_it_out() -> None:
    assert lines(SreportArgs(), "gpu-east", JAN14, JAN15, ROWS) == [
        "-" * 80,
        "Cluster/Account/User Utilization 2027-01-14T00:00:00 - 2027-01-14T23:59:59 (86400 secs)",
        "Usage reported in GPU Minutes",
        "-" * 80,
        "  Cluster         Account     Login     Proper Name     Used   Energy",
        "--------- --------------- --------- --------------- -------- --------",
        " gpu-east            root                                150        0",
        " gpu-east            prod                                 30        0",
        " gpu-east            prod      dave                       30        0",
        " gpu-east        research                                120        0",
        " gpu-east        research     alice                      120        0",
    ]


def test_parsable_without_headers_is_what_scripts_read() -> None:
    args = SreportArgs(unit="hours", delimiter="|", header=False)
    assert lines(args, "a-very-long-cluster", JAN14, JAN15, ROWS) == [
        "a-very-long-cluster|root|||2|0",
        "a-very-long-cluster|prod|||0|0",
        "a-very-long-cluster|prod|dave||0|0",
        "a-very-long-cluster|research|||2|0",
        "a-very-long-cluster|research|alice||2|0",
    ]
    trailing = lines(SreportArgs(delimiter="|", trailing=True), "c", JAN14, JAN15, ROWS[:1])
    assert trailing[4:] == [
        "Cluster|Account|Login|Proper Name|Used|Energy|",
        "c|root|||30|0|",
        "c|prod|||30|0|",
    ]
    cut = lines(SreportArgs(header=False), "a-very-long-cluster", JAN14, JAN15, ())
    assert cut == ["a-very-l+            root                                  0        0"]


def test_root_counts_a_sub_accounts_usage_once() -> None:
    rows = (
        ReportRow(account="ml", gpu_seconds=5400.0, billed=5400.0, share=1.0),
        ReportRow(account="ml", user="alice", gpu_seconds=1800.0, billed=1800.0, share=1 / 3),
        ReportRow(account="ml-nlp", gpu_seconds=3600.0, billed=3600.0, share=2 / 3, depth=2),
        ReportRow(
            account="ml-nlp", user="bob", gpu_seconds=3600.0, billed=3600.0, share=2 / 3, depth=2
        ),
    )
    args = SreportArgs(unit="minutes", delimiter="|", header=False)
    assert lines(args, "c", JAN14, JAN15, rows) == [
        "c|root|||90|0",  # ml's 90 minutes take in ml-nlp's 60
        "c|ml|||90|0",
        "c|ml|alice||30|0",
        "c|ml-nlp|||60|0",
        "c|ml-nlp|bob||60|0",
    ]


USERS = (
    ReportRow(account="ml", gpu_seconds=9000.0, billed=9000.0, share=1.0),
    ReportRow(account="ml", user="alice", gpu_seconds=1800.0, billed=1800.0, share=0.2),
    ReportRow(account="ml", user="bob", gpu_seconds=3600.0, billed=3600.0, share=0.4),
    ReportRow(account="nlp", gpu_seconds=3600.0, billed=3600.0, share=0.4, depth=2),
    ReportRow(account="nlp", user="alice", gpu_seconds=3600.0, billed=3600.0, share=0.4,
              depth=2),
)  # fmt: skip


def test_users_by_account_most_used_first() -> None:
    args = SreportArgs(report=Report.USER_BY_ACCOUNT)
    assert lines(args, "c", JAN14, JAN15, USERS) == [
        "-" * 80,
        "Cluster/User/Account Utilization 2027-01-14T00:00:00 - 2027-01-14T23:59:59 (86400 secs)",
        "Usage reported in GPU Minutes",
        "-" * 80,
        "  Cluster     Login     Proper Name         Account     Used   Energy",
        "--------- --------- --------------- --------------- -------- --------",
        "        c     alice                             nlp       60        0",
        "        c       bob                              ml       60        0",
        "        c     alice                              ml       30        0",
    ]


def test_top_usage_takes_the_first_and_groups_a_users_accounts() -> None:
    top = SreportArgs(report=Report.TOP_USAGE, delimiter="|", header=False, top_count=2)
    assert lines(top, "c", JAN14, JAN15, USERS) == ["c|alice||nlp|60|0", "c|bob||ml|60|0"]
    grouped = SreportArgs(report=Report.TOP_USAGE, delimiter="|", group=True)
    assert lines(grouped, "c", JAN14, JAN15, USERS)[1:] == [
        "Top 10 Users 2027-01-14T00:00:00 - 2027-01-14T23:59:59 (86400 secs)",
        "Usage reported in GPU Minutes",
        "-" * 80,
        "Cluster|Login|Proper Name|Account|Used|Energy",
        "c|alice||ml,nlp|90|0",
        "c|bob||ml|60|0",
    ]


def test_the_clusters_utilization_as_slurm_lays_it_out() -> None:
    usage = ClusterUsage(allocated_s=7200.0, idle_s=3600.0, planned_down_s=600.0, down_s=60.0)
    args = SreportArgs(report=Report.UTILIZATION)
    assert cluster_lines(args, "gpu-east", JAN14, JAN15, usage) == [
        "-" * 80,
        "Cluster Utilization 2027-01-14T00:00:00 - 2027-01-14T23:59:59 (86400 secs)",
        "Usage reported in GPU Minutes",
        "-" * 80,
        "  Cluster  Allocated      Down PLND Down      Idle   Reported",
        "--------- ---------- --------- --------- --------- ----------",
        " gpu-east        120         1        10        60        191",
    ]
    parsable = SreportArgs(report=Report.UTILIZATION, unit="seconds", delimiter="|")
    assert cluster_lines(parsable, "c", JAN14, JAN15, usage)[4:] == [
        "Cluster|Allocated|Down|PLND Down|Idle|Reported",
        "c|7200|60|600|3600|11460",
    ]


def test_job_sizes_as_slurm_lays_them_out() -> None:
    rows = (
        SizeRow(account="ml", gpu_seconds=(3600.0, 43200.0), jobs=(1, 2), share=0.9286),
        SizeRow(account="ops", gpu_seconds=(3600.0, 0.0), jobs=(3, 0), share=0.0714),
    )
    args = SreportArgs(report=Report.SIZES, unit="hours", grouping=(8,))
    assert sizes_lines(args, "c", JAN14, JAN15, (8,), rows) == [
        "-" * 80,
        "Job Sizes 2027-01-14T00:00:00 - 2027-01-14T23:59:59 (86400 secs)",
        "Usage reported in GPU Hours",
        "-" * 80,
        "  Cluster   Account      0-7 GPUs     >= 8 GPUs % of cluster",
        "--------- --------- ------------- ------------- ------------",
        "        c        ml             1            12       92.86%",
        "        c       ops             1             0        7.14%",
    ]
    counts = SreportArgs(report=Report.SIZES, delimiter="|", job_count=True, grouping=(8,))
    assert sizes_lines(counts, "c", JAN14, JAN15, (8,), rows)[2:] == [
        "Units are in number of jobs ran",
        "-" * 80,
        "Cluster|Account|0-7 GPUs|>= 8 GPUs|% of cluster",
        "c|ml|1|2|92.86%",
        "c|ops|3|0|7.14%",
    ]
