"""Usage reports over a window (services/fairshare/report.py): whole hours, accounts
with their users under them, each one's share of the window, the text table, and who
sees which rows."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.fairshare.acct import visible_usage_rows
from services.fairshare.report import (
    HourlyUsage,
    ReportRow,
    TimeUnit,
    below,
    render_report,
    report_rows,
    window,
)
from shared.identity import Directory
from shared.privacy import PrivateData


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


NOW = at("2027-01-15T13:20:00")


@pytest.mark.parametrize(
    ("since", "until", "want"),
    [
        (None, None, ("2027-01-14T00:00", "2027-01-15T00:00")),  # sreport's: yesterday
        ("2027-01-14T08:30", None, ("2027-01-14T08:00", "2027-01-15T14:00")),  # until now
        ("2027-01-15T08:00", "2027-01-15T10:00", ("2027-01-15T08:00", "2027-01-15T10:00")),
        ("2027-01-15T08:59:59", "2027-01-15T09:00:01", ("2027-01-15T08:00", "2027-01-15T10:00")),
        ("2027-01-10T00:00", "2027-01-15T13:20", ("2027-01-10T00:00", "2027-01-15T14:00")),
    ],
)  # fmt: skip
def test_a_window_is_whole_hours(
    since: str | None, until: str | None, want: tuple[str, str]
) -> None:
    got = window(at(since) if since else None, at(until) if until else None, NOW)
    assert got == (at(want[0]), at(want[1]))


def test_a_window_that_ends_before_it_starts_says_what_to_change() -> None:
    with pytest.raises(ValueError) as err:
        window(at("2027-01-15T10:00:00"), at("2027-01-15T09:00:00"), NOW)
    assert str(err.value) == (
        "the window ends (2027-01-15T09:00:00) before it starts (2027-01-15T10:00:00):"
        " give an end (-E) after the start (-S)"
    )


USAGE = [
    HourlyUsage(account="research", user="bob", gpu_seconds=3600.0, billed=7200.0),
    HourlyUsage(account="prod", user="dave", gpu_seconds=1800.0, billed=1800.0),
    HourlyUsage(account="research", user="alice", gpu_seconds=7200.0, billed=14400.0),
    HourlyUsage(account="research", user="carol", gpu_seconds=0.0, billed=0.0),
]


def test_accounts_by_name_each_followed_by_its_users_most_used_first() -> None:
    rows = report_rows(USAGE)
    assert [(r.account, r.user, r.gpu_seconds, r.billed) for r in rows] == [
        ("prod", None, 1800.0, 1800.0),
        ("prod", "dave", 1800.0, 1800.0),
        ("research", None, 10800.0, 21600.0),
        ("research", "alice", 7200.0, 14400.0),
        ("research", "bob", 3600.0, 7200.0),
    ]  # carol used nothing: left out
    assert [round(r.share, 4) for r in rows] == [0.1429, 0.1429, 0.8571, 0.5714, 0.2857]
    assert [r.user for r in report_rows(USAGE, by_user=False)] == [None, None]
    assert report_rows([]) == ()


TREE = {"ml": None, "ml-vision": "ml", "ml-nlp": "ml", "ml-idle": "ml", "ops": None}
TREE_USAGE = [
    HourlyUsage(account="ml-vision", user="bob", gpu_seconds=7200.0, billed=7200.0),
    HourlyUsage(account="ml", user="alice", gpu_seconds=3600.0, billed=3600.0),
    HourlyUsage(account="ml-nlp", user="carol", gpu_seconds=1800.0, billed=3600.0),
    HourlyUsage(account="ops", user="dave", gpu_seconds=1800.0, billed=1800.0),
    HourlyUsage(account="gone", user="erin", gpu_seconds=1800.0, billed=1800.0),
]


def test_an_account_counts_its_sub_accounts_which_follow_its_users() -> None:
    rows = report_rows(TREE_USAGE, parents=TREE)
    assert [(r.depth, r.account, r.user, r.gpu_seconds, r.billed) for r in rows] == [
        (1, "gone", None, 1800.0, 1800.0),  # no longer in the tree: under the root
        (1, "gone", "erin", 1800.0, 1800.0),
        (1, "ml", None, 12600.0, 14400.0),  # alice's, and both sub-accounts'
        (1, "ml", "alice", 3600.0, 3600.0),
        (2, "ml-nlp", None, 1800.0, 3600.0),
        (2, "ml-nlp", "carol", 1800.0, 3600.0),
        (2, "ml-vision", None, 7200.0, 7200.0),
        (2, "ml-vision", "bob", 7200.0, 7200.0),
        (1, "ops", None, 1800.0, 1800.0),
        (1, "ops", "dave", 1800.0, 1800.0),
    ]  # ml-idle used nothing: left out
    assert round(rows[2].share, 4) == round(12600 / 16200, 4)
    assert sum(r.gpu_seconds for r in rows if r.user is None and r.depth == 1) == 16200.0
    flat = report_rows(TREE_USAGE, parents=TREE, by_user=False)
    assert [(r.depth, r.account) for r in flat] == [
        (1, "gone"), (1, "ml"), (2, "ml-nlp"), (2, "ml-vision"), (1, "ops"),
    ]  # fmt: skip


def test_a_report_for_an_account_takes_in_the_accounts_below_it() -> None:
    assert below(["ml"], TREE) == ("ml", "ml-idle", "ml-nlp", "ml-vision")
    assert below(["ml-nlp", "ops"], TREE) == ("ml-nlp", "ops")
    assert below([], TREE) == ()
    # only a sub-account asked for: it is shown under the root, its parent not at all
    shown = report_rows(TREE_USAGE[:1], parents={"ml-vision": "ml"})
    assert [(r.depth, r.account, r.user) for r in shown] == [
        (1, "ml-vision", None), (1, "ml-vision", "bob"),
    ]  # fmt: skip


def test_accounts_in_a_cycle_of_parents_are_still_reported() -> None:
    usage = [HourlyUsage(account="a", user="u", gpu_seconds=60.0, billed=60.0)]
    rows = report_rows(usage, parents={"a": "b", "b": "a"})
    assert [(r.depth, r.account, r.user, r.gpu_seconds) for r in rows] == [
        (1, "a", None, 60.0), (1, "a", "u", 60.0),
    ]  # fmt: skip


def test_the_table_gives_the_window_and_gpu_time_in_the_unit_asked() -> None:
    text = render_report(
        report_rows(USAGE), at("2027-01-14T00:00:00"), at("2027-01-15T00:00:00"), TimeUnit.HOURS
    )
    assert text == (
        "Usage 2027-01-14T00:00:00 - 2027-01-15T00:00:00 (UTC), GPU time in hours\n"
        "Account  User  GPU-hours Billed-hours  Share\n"
        "-------- ----- --------- ------------ ------\n"
        "prod                0.50         0.50 14.29%\n"
        "prod     dave       0.50         0.50 14.29%\n"
        "research            3.00         6.00 85.71%\n"
        "research alice      2.00         4.00 57.14%\n"
        "research bob        1.00         2.00 28.57%"
    )
    minutes = render_report(report_rows(USAGE, by_user=False), 0.0, 3600.0, TimeUnit.MINUTES)
    assert minutes.splitlines()[3:] == [
        "prod                30.00          30.00 14.29%",
        "research           180.00         360.00 85.71%",
    ]
    seconds = render_report(report_rows(USAGE[1:2]), 0.0, 3600.0, TimeUnit.SECONDS)
    assert seconds.splitlines()[-1] == "prod    dave        1800           1800 100.00%"
    tree = render_report(report_rows(TREE_USAGE[:3], parents=TREE, by_user=False), 0.0, 3600.0)
    assert tree.splitlines()[3:] == [
        "ml                   3.50         4.00 100.00%",
        " ml-nlp              0.50         1.00  14.29%",
        " ml-vision           2.00         2.00  57.14%",
    ]  # a sub-account indented under its parent


def test_others_user_rows_are_left_out_when_usage_is_private() -> None:
    rows = report_rows(USAGE)
    private = Directory(private=frozenset({PrivateData.USAGE}), operators=frozenset({"root"}))
    mine = visible_usage_rows(rows, "bob", private)
    assert [(r.account, r.user) for r in mine] == [
        ("prod", None),
        ("research", None),
        ("research", "bob"),
    ]  # every account's total, and bob's own row
    assert visible_usage_rows(rows, "root", private) == rows
    public = Directory(private=frozenset(), operators=frozenset())
    assert visible_usage_rows(rows, "bob", public) == rows
    assert isinstance(rows[0], ReportRow)
