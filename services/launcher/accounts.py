"""The accounts a node agent may run jobs as: no system account (a uid below `min_uid`,
Slurm-like 1000 by default) unless it is named in `allowed`, and root only with
`allow_root`. `refusal` is the pure rule; `job_account` looks the account up (NSS)."""

from __future__ import annotations

import os
import pwd

import msgspec

from services.launcher.executor import LaunchError, RootNotAllowed, RunAs, resolve_run_as

DEFAULT_MIN_UID = 1000


class AccountPolicy(msgspec.Struct, frozen=True, kw_only=True):
    min_uid: int = DEFAULT_MIN_UID
    allowed: frozenset[str] = frozenset()  # accounts allowed below min_uid
    allow_root: bool = False


class SystemAccountRefused(LaunchError):
    def __init__(self, user: str, uid: int, min_uid: int) -> None:
        self.user = user
        self.uid = uid
        self.min_uid = min_uid
        super().__init__(
            f"refusing to run a job as {user!r} (uid {uid}): a system account, below "
            f"min_job_uid {min_uid}; submit as an ordinary user, or an operator lists the "
            "account in allowed_job_users"
        )


def refusal(user: str, uid: int, policy: AccountPolicy) -> LaunchError | None:
    """Why a job may not run as `user` (uid `uid`), or None."""
    if uid == 0:
        return None if policy.allow_root else RootNotAllowed(user)
    if uid < policy.min_uid and user not in policy.allowed:
        return SystemAccountRefused(user, uid, policy.min_uid)
    return None


def job_account(user: str | None, policy: AccountPolicy) -> RunAs | None:
    """The account `user` resolved on this node (None: the agent's own user), raising a
    `LaunchError` when the policy refuses it."""
    if user:
        run_as = resolve_run_as(user, allow_root=policy.allow_root)
        name, uid = run_as.user, run_as.uid
    else:
        run_as, uid = None, os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
    refused = refusal(name, uid, policy)
    if refused is not None:
        raise refused
    return run_as


def account_policy(min_uid: int, allowed: str, allow_root: bool) -> AccountPolicy:
    """The policy from the node's settings (`allowed`: comma-separated account names)."""
    names = frozenset(n.strip() for n in allowed.split(",") if n.strip())
    return AccountPolicy(min_uid=min_uid, allowed=names, allow_root=allow_root)
