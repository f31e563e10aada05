"""Contracts: the accounting API the fairshare service answers itself, request-reply on
NATS in queue group `fairshare` (`muster.api.share`, `muster.api.acct`,
`muster.api.report`, `muster.api.cluster_report`, `muster.api.sizes_report`).

Replies travel in the same `shared.api.Envelope` as admission's; field names of the
replies are the `--json` contract.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from services.fairshare.cluster_report import ClusterUsage
from services.fairshare.core import FairShareAlgorithm, ShareRow
from services.fairshare.render import AcctRow
from services.fairshare.report import ReportRow
from services.fairshare.sizes_report import DEFAULT_GROUPING, SizeRow
from shared.api import Request

QUEUE_GROUP = "fairshare"
SHARE_VERB = "share"
ACCT_VERB = "acct"
REPORT_VERB = "report"
CLUSTER_VERB = "cluster_report"
SIZES_VERB = "sizes_report"


class ShareRequest(Request, frozen=True, kw_only=True):
    accounts: tuple[str, ...] = ()  # only these accounts (and what lies under them)
    users: tuple[str, ...] = ()  # only these users' rows (their accounts are kept)


class ShareReply(msgspec.Struct, frozen=True, kw_only=True):
    algorithm: FairShareAlgorithm
    half_life_s: float
    rows: tuple[ShareRow, ...]


class AcctRequest(Request, frozen=True, kw_only=True):
    job_ids: tuple[int, ...] = ()
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    since: float | None = None  # epoch seconds: jobs still running or ended after this
    until: float | None = None  # epoch seconds: jobs submitted before this
    attempts: bool = True  # one record per attempt after each job's record
    steps: bool = False  # one record per srun step (JOB.STEP) after those, as sacct lists
    limit: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000


class AcctReply(msgspec.Struct, frozen=True, kw_only=True):
    rows: tuple[AcctRow, ...]


class ReportRequest(Request, frozen=True, kw_only=True):
    since: float | None = None  # epoch seconds, rounded down to the hour; None: yesterday
    until: float | None = None  # epoch seconds, rounded up; None: now (today 00:00 if no since)
    accounts: tuple[str, ...] = ()  # only these accounts
    users: tuple[str, ...] = ()  # only these users
    by_user: bool = True  # each account's users under it


class ReportReply(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str = "muster"  # `[cluster] name`
    since: float  # the whole hours reported
    until: float
    rows: tuple[ReportRow, ...]


class ClusterRequest(Request, frozen=True, kw_only=True):
    since: float | None = None  # as ReportRequest's: whole hours, yesterday by default
    until: float | None = None


class ClusterReply(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str = "muster"
    since: float
    until: float
    usage: ClusterUsage


class SizesRequest(Request, frozen=True, kw_only=True):
    since: float | None = None  # as ReportRequest's: whole hours, yesterday by default
    until: float | None = None
    accounts: tuple[str, ...] = ()  # these accounts' rows (each with its sub-accounts)
    grouping: tuple[int, ...] = DEFAULT_GROUPING  # the size ranges' lower bounds


class SizesReply(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str = "muster"
    since: float
    until: float
    grouping: tuple[int, ...]
    rows: tuple[SizeRow, ...]
