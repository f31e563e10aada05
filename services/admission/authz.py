"""Pure: who may do what to which job, decided from the cluster configuration.

Users act on their own jobs; an account coordinator acts on every job of the accounts
they coordinate and of those accounts' sub-accounts; operators act on everything.
Node and cluster actions (drain, resume, approve, config reload) are operator-only.
The actor is the verified user of the request's key (shared.identity); who may *see*
other users' jobs is shared.privacy's (`[cluster] private_data`).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from .config_model import ClusterConfig


class Action(StrEnum):
    VIEW = "view"
    CANCEL = "cancel"
    HOLD = "hold"
    RELEASE = "release"
    REQUEUE = "requeue"
    SIGNAL = "signal"
    MODIFY = "modify"
    DRAIN = "drain"
    RESUME = "resume"
    APPROVE = "approve"
    RELOAD_CONFIG = "reload_config"


OPERATOR_ONLY = frozenset({Action.DRAIN, Action.RESUME, Action.APPROVE, Action.RELOAD_CONFIG})


class RefusalCode(StrEnum):
    OPERATOR_ONLY = "operator_only"
    NOT_YOUR_JOB = "not_your_job"


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    code: RefusalCode
    message: str


def is_coordinator(actor: str, account: str, config: ClusterConfig) -> bool:
    """Coordinators of an account also coordinate its sub-accounts."""
    return any(actor in config.accounts[a].coordinators for a in config.ancestors(account))


def authorize(
    action: Action,
    actor: str,
    job_owner: str | None,
    job_account: str | None,
    config: ClusterConfig,
) -> Refusal | None:
    """None when `actor` may do `action`; otherwise a refusal that says why.

    `job_owner` and `job_account` are None for actions that concern no job.
    """
    if actor in config.operators or action is Action.VIEW:
        return None
    if action in OPERATOR_ONLY:
        return Refusal(
            code=RefusalCode.OPERATOR_ONLY,
            message=f"only an operator may {action.value.replace('_', ' ')}; "
            f"{actor!r} is not an operator",
        )
    if job_owner is not None and actor == job_owner:
        return None
    if job_account is not None and is_coordinator(actor, job_account, config):
        return None
    return Refusal(
        code=RefusalCode.NOT_YOUR_JOB,
        message=f"{actor!r} may not {action.value} a job of {job_owner!r}"
        f"{f' in account {job_account!r}' if job_account else ''}: only its owner, a "
        "coordinator of its account, or an operator may",
    )
