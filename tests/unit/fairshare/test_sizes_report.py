"""Allocated GPU time by job size per account (services/fairshare/sizes_report.py): the
size ranges a grouping gives, the row an account counts in, each row's time, jobs and
share, and the table."""

from __future__ import annotations

import re

import pytest

from services.fairshare.report import TimeUnit
from services.fairshare.sizes_report import (
    AllocatedTime,
    SizeRow,
    checked_grouping,
    parse_grouping,
    range_names,
    render_sizes,
    root_of,
    size_range,
    size_rows,
)

T0 = 1_800_000_000.0 // 3600 * 3600
# ml under the root (written either way), nlp under ml, ops under the root
PARENTS: dict[str, str | None] = {"ml": None, "nlp": "ml", "ops": "root"}


@pytest.mark.parametrize(
    ("text", "grouping"),
    [("8,64,256", (8, 64, 256)), ("1", (1,)), (" 4, 32 ", (4, 32))],
)
def test_a_grouping_is_increasing_gpu_counts(text: str, grouping: tuple[int, ...]) -> None:
    assert parse_grouping(text) == grouping


@pytest.mark.parametrize("text", ["", "0,8", "8,8", "64,8", "eight", "8,,x"])
def test_a_grouping_that_is_not_is_refused_saying_what_to_write(text: str) -> None:
    said = "give increasing GPU counts above 0, e.g. 8,64,256"
    with pytest.raises(ValueError, match=re.escape(said)):
        parse_grouping(text)


def test_a_grouping_sent_as_numbers_is_checked_alike() -> None:
    assert checked_grouping([8, 64]) == (8, 64)
    with pytest.raises(ValueError, match=re.escape("grouping '64,8': give increasing")):
        checked_grouping((64, 8))


def test_the_ranges_of_a_grouping() -> None:
    assert range_names((8, 64, 256)) == ["0-7 GPUs", "8-63 GPUs", "64-255 GPUs", ">= 256 GPUs"]
    assert [size_range(g, (8, 64, 256)) for g in (0, 1, 7, 8, 63, 64, 255, 256, 4096)] == [
        0, 0, 0, 1, 1, 2, 2, 3, 3,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("account", "roots", "row"),
    [
        ("ml", (), "ml"),
        ("nlp", (), "ml"),  # a sub-account counts in the account under the root
        ("ops", (), "ops"),
        ("gone", (), "gone"),  # no longer in the configuration: a row of its own
        ("nlp", ("nlp",), "nlp"),  # asked for: its own row
        ("ml", ("nlp",), None),  # not under one asked for: nowhere
        ("gone", ("ml",), None),
    ],
)
def test_the_row_an_account_counts_in(
    account: str, roots: tuple[str, ...], row: str | None
) -> None:
    assert root_of(account, PARENTS, roots) == row


def a(job: int, account: str, gpus: int, seconds: float) -> AllocatedTime:
    return AllocatedTime(job_id=job, account=account, gpus=gpus, gpu_seconds=gpus * seconds)


ALLOCATED = [
    a(1, "ml", 8, 3600.0),  # 8 GPUs an hour
    a(1, "ml", 8, 1800.0),  # its requeued attempt: the same job
    a(2, "nlp", 1, 3600.0),
    a(3, "ops", 64, 900.0),
]


def test_each_account_s_time_and_jobs_per_size_and_its_share() -> None:
    rows = size_rows(ALLOCATED, (8, 64), PARENTS)
    total = 8 * 5400 + 3600 + 64 * 900
    assert rows == [
        SizeRow(account="ml", gpu_seconds=(3600.0, 43200.0, 0.0), jobs=(1, 1, 0),
                share=(3600 + 43200) / total),
        SizeRow(account="ops", gpu_seconds=(0.0, 0.0, 57600.0), jobs=(0, 0, 1),
                share=57600 / total),
    ]  # fmt: skip
    asked = size_rows(ALLOCATED, (8, 64), PARENTS, ("nlp", "ops"))
    assert [(r.account, r.gpu_seconds[0], r.share) for r in asked] == [
        ("nlp", 3600.0, 3600 / (3600 + 57600)),
        ("ops", 0.0, 57600 / (3600 + 57600)),
    ]
    idle = size_rows([], (8,), PARENTS, ("ml",))
    assert idle == [SizeRow(account="ml", gpu_seconds=(0.0, 0.0), jobs=(0, 0), share=0.0)]


def test_the_table_in_time_or_in_jobs() -> None:
    rows = size_rows(ALLOCATED, (8, 64), PARENTS)
    assert render_sizes(rows, (8, 64), T0, T0 + 3600, TimeUnit.HOURS).splitlines() == [
        "Job sizes 2027-01-15T08:00:00 - 2027-01-15T09:00:00 (UTC), allocated GPU time in hours",
        "Account 0-7 GPUs 8-63 GPUs >= 64 GPUs  Share",
        "------- -------- --------- ---------- ------",
        "ml          1.00     12.00       0.00 44.83%",
        "ops         0.00      0.00      16.00 55.17%",
    ]
    jobs = render_sizes(rows, (8, 64), T0, T0 + 3600, job_counts=True).splitlines()
    assert jobs[0].endswith(", jobs") and jobs[3].split() == ["ml", "1", "1", "0", "44.83%"]
