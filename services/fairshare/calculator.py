"""Pure core: a cached fair-share calculator for the placer and the trace simulator.

`FairShareCalculator.update(usage)` recomputes the share table once; `factor(account,
user)` is then a dictionary lookup. `make_priority_fn` wraps a calculator and the
priority weights into the simulator's `priority_fn(job, now, usage_by_account) -> float`
hook, recomputing fair share only when the usage it is handed changes.

The calculator holds state (its last table) but does no I/O and reads no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from services.fairshare.core import ShareOptions, ShareRow, ShareTable, compute_shares, user_factors
from services.fairshare.priority import JobFactorsInput, PriorityWeights, priority
from services.fairshare.tree import Account, AccountTree, Assoc, UserAssoc, build

NEWCOMER_FACTOR = 1.0  # an account or user with no association and no usage


class FairShareCalculator:
    """Fair-share factors for a fixed tree, refreshed from usage on `update`.

    Usage keyed by account name is charged to the account itself (the simulator's
    `usage_by_account`); usage keyed by `Assoc(account, user)` to that user. With
    `auto_add` (the default), accounts and users seen in usage but missing from the
    tree are added, accounts under root, each with `default_shares`.
    """

    def __init__(
        self,
        tree: AccountTree | None = None,
        options: ShareOptions | None = None,
        *,
        auto_add: bool = True,
        default_shares: int = 1,
    ) -> None:
        self._tree = tree or AccountTree()
        self._options = options or ShareOptions()
        self._auto_add = auto_add
        self._default_shares = default_shares
        self._usage: dict[Assoc, float] = {}
        self._table = compute_shares(self._tree, {}, self._options)
        self._factors = user_factors(self._table)

    @property
    def table(self) -> ShareTable:
        return self._table

    @property
    def rows(self) -> tuple[ShareRow, ...]:
        return self._table.rows

    def update(
        self,
        usage_by_account: Mapping[str, float] | None = None,
        *,
        by_assoc: Mapping[Assoc, float] | None = None,
    ) -> ShareTable:
        """Recompute every factor from (decayed) usage; returns the new share table."""
        usage: dict[Assoc, float] = {}
        for account, value in (usage_by_account or {}).items():
            key = Assoc(account)
            usage[key] = usage.get(key, 0.0) + value
        for assoc, value in (by_assoc or {}).items():
            usage[assoc] = usage.get(assoc, 0.0) + value
        if self._auto_add:
            self._tree = self._with_newcomers(usage.keys())
        self._usage = usage
        return self._recompute()

    def ensure(self, account: str, user: str) -> bool:
        """Add a user association seen for the first time (a job's); True if it was new.

        Does nothing without `auto_add`: then the tree is authoritative.

        Recomputes with the last usage, so the newcomer is ranked among the others.
        """
        if not self._auto_add or Assoc(account, user) in self._factors:
            return False
        tree = self._with_newcomers((Assoc(account, user),))
        if tree is self._tree:
            return False
        self._tree = tree
        self._recompute()
        return True

    def _recompute(self) -> ShareTable:
        self._table = compute_shares(build(self._tree), self._usage, self._options)
        self._factors = user_factors(self._table)
        return self._table

    def factor(self, account: str, user: str) -> float:
        """The user's fair-share factor in the account; newcomers get what a user with
        no usage would get there (Fair Tree: the account's best rank)."""
        found = self._factors.get(Assoc(account, user))
        if found is not None:
            return found
        return self._table.newcomer_factor.get(account, NEWCOMER_FACTOR)

    def _with_newcomers(self, seen: Iterable[Assoc]) -> AccountTree:
        accounts = {a.name for a in self._tree.accounts}
        members = {(u.account, u.user) for u in self._tree.users}
        new_accounts = list(self._tree.accounts)
        new_users = list(self._tree.users)
        for assoc in sorted(seen):
            if assoc.account not in accounts and assoc.account != "root":
                accounts.add(assoc.account)
                new_accounts.append(Account(name=assoc.account, shares=self._default_shares))
            if assoc.user and (assoc.account, assoc.user) not in members:
                members.add((assoc.account, assoc.user))
                new_users.append(
                    UserAssoc(user=assoc.user, account=assoc.account, shares=self._default_shares)
                )
        if len(new_accounts) == len(self._tree.accounts) and len(new_users) == len(
            self._tree.users
        ):
            return self._tree
        return AccountTree(accounts=tuple(new_accounts), users=tuple(new_users))


def _first(job: Any, names: tuple[str, ...], default: Any) -> Any:
    for name in names:
        value = getattr(job, name, None)
        if value is not None:
            return value
    return default


def job_factors_input(
    job: Any, fairshare: float, *, cluster_gpus: int = 0, now: float = 0.0
) -> JobFactorsInput:
    """Read a job-like object (JobSpec, a simulator job) into `JobFactorsInput`.

    Looks for `eligible_at`/`submit_time`/`submitted_at`/`begin_at` (else `now`),
    `gpus`/`gpus_requested`/`gpus_total`, `partition`, `qos` and `nice`.
    """
    if isinstance(job, JobFactorsInput):
        return msgspec.structs.replace(job, fairshare=fairshare)
    return JobFactorsInput(
        eligible_at=float(
            _first(job, ("eligible_at", "submit_time", "submitted_at", "begin_at"), now)
        ),
        fairshare=fairshare,
        gpus=int(_first(job, ("gpus", "gpus_requested", "gpus_total"), 0)),
        cluster_gpus=cluster_gpus,
        partition=str(_first(job, ("partition",), "normal")),
        qos=str(_first(job, ("qos",), "normal")),
        nice=int(_first(job, ("nice",), 0)),
    )


PriorityFn = Callable[[Any, float, Mapping[str, float]], float]


def make_priority_fn(
    calculator: FairShareCalculator,
    weights: PriorityWeights,
    *,
    cluster_gpus: int = 0,
) -> PriorityFn:
    """The simulator hook: `priority_fn(job, now, usage_by_account) -> float`.

    The job needs `user` and `account` attributes (see `job_factors_input` for the
    rest). Fair share is recomputed only when `usage_by_account` differs from the
    last one seen, so calling it for every pending job of a pass stays cheap.
    """
    last: dict[str, float] | None = None

    def priority_fn(job: Any, now: float, usage_by_account: Mapping[str, float]) -> float:
        nonlocal last
        if last is None or usage_by_account != last:
            last = dict(usage_by_account)
            calculator.update(last)
        account, user = str(job.account), str(job.user)
        calculator.ensure(account, user)
        fs = calculator.factor(account, user)
        inp = job_factors_input(job, fs, cluster_gpus=cluster_gpus, now=now)
        return priority(inp, weights, now).total

    return priority_fn
