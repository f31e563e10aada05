"""Who may act on which job: owners, coordinators of the account tree, operators."""

from __future__ import annotations

import pytest

from services.admission.authz import Action, Refusal, RefusalCode, authorize

from .builders import local_config

CONFIG = local_config()  # operators: root, admin; carol coordinates research, dave prod

ALLOWED = {
    "an owner cancels their own job": (Action.CANCEL, "alice", "alice", "research"),
    "an owner holds their own job": (Action.HOLD, "bob", "bob", "prod"),
    "a coordinator cancels a job in their account": (Action.CANCEL, "carol", "alice", "research"),
    "a coordinator of the root account acts on sub-accounts": (
        Action.REQUEUE,
        "dave",
        "dave",
        "prod",
    ),
    "an operator cancels anyone's job": (Action.CANCEL, "admin", "alice", "research"),
    "an operator drains nodes": (Action.DRAIN, "root", None, None),
    "an operator approves": (Action.APPROVE, "admin", "bob", "research"),
    "anyone views the queue": (Action.VIEW, "alice", "bob", "prod"),
}


@pytest.mark.parametrize(
    ("action", "actor", "owner", "account"), ALLOWED.values(), ids=ALLOWED.keys()
)
def test_allowed(action: Action, actor: str, owner: str | None, account: str | None) -> None:
    assert authorize(action, actor, owner, account, CONFIG) is None


REFUSED = {
    "a user cancels someone else's job": (
        Action.CANCEL,
        "alice",
        "bob",
        "prod",
        Refusal(
            code=RefusalCode.NOT_YOUR_JOB,
            message="'alice' may not cancel a job of 'bob' in account 'prod': only its owner, "
            "a coordinator of its account, or an operator may",
        ),
    ),
    "a coordinator of another account": (
        Action.HOLD,
        "dave",
        "alice",
        "research",
        Refusal(
            code=RefusalCode.NOT_YOUR_JOB,
            message="'dave' may not hold a job of 'alice' in account 'research': only its "
            "owner, a coordinator of its account, or an operator may",
        ),
    ),
    "a user drains a node": (
        Action.DRAIN,
        "alice",
        None,
        None,
        Refusal(
            code=RefusalCode.OPERATOR_ONLY,
            message="only an operator may drain; 'alice' is not an operator",
        ),
    ),
    "a coordinator approves a large job": (
        Action.APPROVE,
        "carol",
        "alice",
        "research",
        Refusal(
            code=RefusalCode.OPERATOR_ONLY,
            message="only an operator may approve; 'carol' is not an operator",
        ),
    ),
    "a user reloads the configuration": (
        Action.RELOAD_CONFIG,
        "bob",
        None,
        None,
        Refusal(
            code=RefusalCode.OPERATOR_ONLY,
            message="only an operator may reload config; 'bob' is not an operator",
        ),
    ),
}


@pytest.mark.parametrize(
    ("action", "actor", "owner", "account", "want"), REFUSED.values(), ids=REFUSED.keys()
)
def test_refused(
    action: Action, actor: str, owner: str | None, account: str | None, want: Refusal
) -> None:
    assert authorize(action, actor, owner, account, CONFIG) == want
