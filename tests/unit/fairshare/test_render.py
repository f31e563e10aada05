"""Text tables for `muster share` and `muster acct`, compared whole."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from services.fairshare.core import FairShareAlgorithm, ShareOptions, ShareRow, compute_shares
from services.fairshare.render import AcctRow, fmt_elapsed, render_acct, render_share_table
from tests.unit.fairshare.builders import SLURM_CLASSIC_TREE, used

SHARE_TABLE = """\
Account User RawShares NormShares RawUsage NormUsage EffectvUsage FairShare  LevelFS
------- ---- --------- ---------- -------- --------- ------------ --------- --------
root                     1.000000    25200  1.000000     1.000000
A                   40   0.400000    16200  0.642857     0.642857           0.622222
 B                  30   0.750000     7200  0.285714     0.444444           1.687500
  B     u1           1   1.000000     7200  0.285714     1.000000  0.600000 1.000000
 C                  10   0.250000     9000  0.357143     0.555556           0.450000
  C     u2           1   0.500000     9000  0.357143     1.000000  0.200000 0.500000
  C     u3           1   0.500000        0  0.000000     0.000000  0.400000      inf
D                   60   0.600000     9000  0.357143     0.357143           1.680000
 E                  25   0.416667     9000  0.357143     1.000000           0.416667
  E     u4           1   1.000000     9000  0.357143     1.000000  0.800000 1.000000
 F                  35   0.583333        0  0.000000     0.000000                inf
  F     u5           1   1.000000        0  0.000000     0.000000  1.000000      inf"""


def test_share_table_reads_like_sshare_long() -> None:
    table = compute_shares(SLURM_CLASSIC_TREE, used(u1__B=7200, u2__C=9000, u4__E=9000))
    assert render_share_table(table.rows) == SHARE_TABLE


def test_share_rows_round_trip_as_json_with_infinite_level_fs_as_null() -> None:
    row = ShareRow(
        account="F",
        user="u5",
        depth=3,
        raw_shares=1,
        norm_shares=1.0,
        raw_usage=0.0,
        norm_usage=0.0,
        effective_usage=0.0,
        level_fs=float("inf"),
        fairshare=1.0,
        rank=5,
    )
    assert msgspec.json.encode(row) == (
        b'{"account":"F","user":"u5","depth":3,"raw_shares":1,"norm_shares":1.0,'
        b'"raw_usage":0.0,"norm_usage":0.0,"effective_usage":0.0,"level_fs":null,'
        b'"fairshare":1.0,"rank":5}'
    )


ACCT_TABLE = """\
JobID Attempt JobName User Account Partition State         GPUs              Submit               Start                 End    Elapsed GPUSeconds  Billed ExitCode    NodeList
----- ------- ------- ---- ------- --------- --------- -------- ------------------- ------------------- ------------------- ---------- ---------- ------- -------- -----------
12    1       train   ada  physics gpu       COMPLETED 16(H100) 2027-01-15T08:00:00 2027-01-15T08:01:00 2027-01-16T09:01:01 1-01:00:01    1440016 2880032        0 gpu01,gpu02
12.3          python  ada  physics gpu       FAILED           8             Unknown 2027-01-15T08:01:40 2027-01-15T08:02:40   00:01:00          0       0      139       gpu02
13                    bob  bio               PENDING          0             Unknown             Unknown             Unknown                     0       0"""  # noqa: E501


def test_acct_table_reads_like_sacct() -> None:
    rows = [
        AcctRow(
            job_id=12,
            attempt=1,
            name="train",
            user="ada",
            account="physics",
            partition="gpu",
            state="COMPLETED",
            gpus=16,
            gpu_model="H100",
            submit=1_800_000_000,
            start=1_800_000_060,
            end=1_800_090_061,
            gpu_seconds=1_440_016,
            billed=2_880_032.0,
            exit_code=0,
            nodes=("gpu01", "gpu02"),
        ),
        AcctRow(
            job_id=12,
            step=3,
            name="python",
            user="ada",
            account="physics",
            partition="gpu",
            state="FAILED",
            gpus=8,
            start=1_800_000_100,
            end=1_800_000_160,
            exit_code=139,
            nodes=("gpu02",),
        ),
        AcctRow(job_id=13, user="bob", account="bio", state="PENDING"),
    ]
    assert render_acct(rows) == ACCT_TABLE


def test_elapsed_is_days_hours_minutes_seconds() -> None:
    assert [fmt_elapsed(s) for s in (None, 0, 59, 3661, 86400, 90001)] == [
        "",
        "00:00:00",
        "00:00:59",
        "01:01:01",
        "1-00:00:00",
        "1-01:00:01",
    ]


GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("algorithm", list(FairShareAlgorithm))
def test_share_rows_json_matches_the_golden_snapshot(algorithm: FairShareAlgorithm) -> None:
    """The `muster share --json` contract: field names and values for Slurm's example."""
    table = compute_shares(
        SLURM_CLASSIC_TREE,
        used(u1__B=7200, u2__C=9000, u4__E=9000),
        ShareOptions(algorithm=algorithm),
    )
    got = msgspec.json.format(msgspec.json.encode(table.rows), indent=1).decode() + "\n"
    assert got == (GOLDEN / f"share_rows_{algorithm.value}.json").read_text()
