"""Time, array, hostlist, dependency and output-pattern formats: tables and properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.admission.hostlist import compress, expand
from services.admission.timefmt import format_duration, parse_begin, parse_duration
from services.admission.values import dependencies, resolve_tasks, signal_spec
from shared.arrays import ArraySpec, format_array, parse_array
from shared.jobspec import Dependency

from .builders import NOW

DURATIONS = {
    "minutes": ("30", 1800),
    "minutes over an hour": ("90", 5400),
    "minutes:seconds": ("5:30", 330),
    "hours:minutes:seconds": ("12:00:01", 43201),
    "days-hours": ("2-3", 2 * 86400 + 3 * 3600),
    "days-hours:minutes": ("1-00:30", 86400 + 1800),
    "days-hours:minutes:seconds": ("7-23:59:59", 7 * 86400 + 86399),
    "UNLIMITED": ("UNLIMITED", None),
    "infinite in any case": ("Infinite", None),
    "surrounding spaces": (" 10 ", 600),
}


@pytest.mark.parametrize(("text", "want"), DURATIONS.values(), ids=DURATIONS.keys())
def test_parse_duration(text: str, want: int | None) -> None:
    assert parse_duration(text) == want


@pytest.mark.parametrize("text", ["", "1:2:3:4", "1-2:3:4:5", "x", "-5", "1h", "1-", "1.5"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected M, M:S, H:M:S"):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**7))
def test_duration_round_trips_through_its_canonical_form(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_unlimited_round_trips() -> None:
    assert parse_duration(format_duration(None)) is None


BEGINS = {
    "now": ("now", NOW),
    "now plus seconds by default": ("now+60", NOW + 60),
    "now plus an hour": ("now+1hour", NOW + 3600),
    "now plus weeks": ("now+2weeks", NOW + 14 * 86400),
    "a date": ("2027-02-01", 1801440000.0),
    "a date and time with seconds": ("2027-02-01T10:00:30", 1801440000.0 + 36030),
    "a clock time later today": ("20:00", NOW + 12 * 3600),
    "noon today": ("noon", NOW + 4 * 3600),
    "teatime": ("teatime", NOW + 8 * 3600),
    "midnight is the next one": ("midnight", NOW + 16 * 3600),
    "a US date this year still to come": ("03/01", 1803859200.0),
    "a US date with a two-digit year": ("01/01/28", 1830297600.0),
    "a US date already past this year means next year": ("01/10", 1831075200.0),
}


@pytest.mark.parametrize(("text", "want"), BEGINS.values(), ids=BEGINS.keys())
def test_parse_begin(text: str, want: float) -> None:
    assert parse_begin(text, now=NOW) == want


@pytest.mark.parametrize("text", ["later", "now+1fortnight", "2027-13-01", "25:00"])
def test_bad_begin_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="expected now"):
        parse_begin(text, now=NOW)


ARRAYS = {
    "a range": ("0-3", ArraySpec(task_ids=(0, 1, 2, 3))),
    "a stepped range with a throttle": (
        "0-15:4%2",
        ArraySpec(task_ids=(0, 4, 8, 12), max_running=2),
    ),
    "a list with a range": ("1,3,5-7", ArraySpec(task_ids=(1, 3, 5, 6, 7))),
    "repeats are merged and sorted": ("5,1-2,2", ArraySpec(task_ids=(1, 2, 5))),
    "one task": ("42", ArraySpec(task_ids=(42,))),
}


@pytest.mark.parametrize(("text", "want"), ARRAYS.values(), ids=ARRAYS.keys())
def test_parse_array(text: str, want: ArraySpec) -> None:
    assert parse_array(text) == want


ARRAY_ERRORS = {
    "backwards": ("5-1", "runs backwards"),
    "zero step": ("0-9:0", "step in '0-9:0' must be 1 or more"),
    "zero throttle": ("0-9%0", "after % must be a count of 1 or more"),
    "over the maximum": ("0-1001", "task id 1001 is over the maximum 1000"),
    "garbage": ("a-b", "is not one of N, N-M"),
}


@pytest.mark.parametrize(("text", "message"), ARRAY_ERRORS.values(), ids=ARRAY_ERRORS.keys())
def test_bad_arrays(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_array(text)


@given(
    st.frozensets(st.integers(min_value=0, max_value=1000), min_size=1, max_size=50),
    st.none() | st.integers(min_value=1, max_value=64),
)
def test_array_round_trips_through_its_canonical_form(ids: frozenset[int], cap: int | None) -> None:
    spec = ArraySpec(task_ids=tuple(sorted(ids)), max_running=cap)
    assert parse_array(format_array(spec)) == spec


HOSTLISTS = {
    "one name": ("node01", ("node01",)),
    "a padded range and a single": ("gpu[001-003,007]", ("gpu001", "gpu002", "gpu003", "gpu007")),
    "several terms": ("a[1-2],b3", ("a1", "a2", "b3")),
    "two bracket groups multiply": ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    "unpadded widths grow": ("n[9-11]", ("n9", "n10", "n11")),
    "repeats are dropped": ("n1,n[1-2]", ("n1", "n2")),
}


@pytest.mark.parametrize(("expr", "want"), HOSTLISTS.values(), ids=HOSTLISTS.keys())
def test_expand(expr: str, want: tuple[str, ...]) -> None:
    assert expand(expr) == want


@pytest.mark.parametrize(
    ("names", "want"),
    [
        (["gpu003", "gpu001", "gpu002", "gpu007"], "gpu[001-003,007]"),
        (["login", "n1"], "login,n1"),
        (["n9", "n10", "n05"], "n05,n[9-10]"),
    ],
)
def test_compress(names: list[str], want: str) -> None:
    assert compress(names) == want


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("n[3-1]", "runs backwards"),
        ("n[1-2", "never closed"),
        ("n1-2]", "without"),
        ("n[[1]]", "nested"),
        ("n[a]", "is not N or N-M"),
        ("n[0-999999]", "more than 100000"),
        ("n 1", "unexpected character"),
    ],
)
def test_bad_hostlists(expr: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand(expr)


hostnames = st.builds(
    lambda prefix, number, width: f"{prefix}{str(number).zfill(width)}",
    st.sampled_from(["gpu", "node", "r1-n", "x"]),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=4),
) | st.sampled_from(["login", "head", "a-b"])


@given(st.lists(hostnames, max_size=40))
def test_hostlist_compress_then_expand_gives_the_same_names(names: list[str]) -> None:
    assert sorted(expand(compress(names))) == sorted(set(names))


DEPENDENCIES = {
    "all of": (
        "afterok:1:2,afterany:3",
        (
            (Dependency(kind="afterok", job_ids=(1, 2)), Dependency(kind="afterany", job_ids=(3,))),
            False,
        ),
    ),
    "any of": (
        "afterok:1?afternotok:2",
        (
            (Dependency(kind="afterok", job_ids=(1,)), Dependency(kind="afternotok", job_ids=(2,))),
            True,
        ),
    ),
    "singleton": ("singleton", ((Dependency(kind="singleton"),), False)),
    "after with mixed delays splits": (
        "after:1+5:2",
        (
            (
                Dependency(kind="after", job_ids=(1,), delay_s=300),
                Dependency(kind="after", job_ids=(2,)),
            ),
            False,
        ),
    ),
    "types are case-insensitive": (
        "AfterOK:9",
        ((Dependency(kind="afterok", job_ids=(9,)),), False),
    ),
    "an array's task, beside a job: looked up at admission": (
        "afterok:12_3:9",
        ((Dependency(kind="afterok", job_ids=(9,), tasks=((12, 3),)),), False),
    ),
}


def test_array_tasks_named_are_replaced_by_their_job_ids() -> None:
    terms, _ = dependencies("afterok:12_3:9,afterany:12_5")
    assert resolve_tasks(terms, {(12, 3): 15, (12, 5): 17}) == (
        (Dependency(kind="afterok", job_ids=(9, 15)), Dependency(kind="afterany", job_ids=(17,))),
        [],
    )
    assert resolve_tasks(terms, {(12, 3): 15}) == (terms, ["12_5"])


@pytest.mark.parametrize(("text", "want"), DEPENDENCIES.values(), ids=DEPENDENCIES.keys())
def test_dependencies(text: str, want: tuple[tuple[Dependency, ...], bool]) -> None:
    assert dependencies(text) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("afterok:1,afterok:2?afterok:3", "not both"),
        ("afterok", "is not a job id"),
        ("singleton:4", "singleton takes no job ids"),
        ("after:1+5:2?afterok:3", "cannot be combined with '\\?'"),
    ],
)
def test_bad_dependencies(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dependencies(text)


SIGNALS = {
    "batch only, with a time": ("B:USR1@90", ("USR1", 90, True, False)),
    "a number": ("12", ("USR2", 60, False, False)),
    "SIG prefix and lower case": ("sigterm@5", ("TERM", 5, False, False)),
    "reservation flag": ("R:INT", ("INT", 60, False, True)),
}


@pytest.mark.parametrize(("text", "want"), SIGNALS.values(), ids=SIGNALS.keys())
def test_signal_spec(text: str, want: tuple[str, int, bool, bool]) -> None:
    assert signal_spec(text) == want
