"""Pure: the refusals admission hands back to a submitter, as data.

A `SubmitError` crosses the request-reply boundary to the CLI, so it is a frozen Struct.
`field` names the option or config key at fault (`nodes`, `time`, `script`, ...) so a
client can point at it; `message` says what is wrong and what would be accepted.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class ErrorCode(StrEnum):
    UNKNOWN_OPTION = "unknown_option"
    AMBIGUOUS_OPTION = "ambiguous_option"
    MISSING_VALUE = "missing_value"
    UNEXPECTED_VALUE = "unexpected_value"
    BAD_VALUE = "bad_value"
    CONFLICTING_OPTIONS = "conflicting_options"
    BAD_DIRECTIVE = "bad_directive"
    SCRIPT_EMPTY = "script_empty"
    SCRIPT_TOO_LARGE = "script_too_large"
    SCRIPT_BINARY = "script_binary"
    SCRIPT_NO_SHEBANG = "script_no_shebang"
    UNKNOWN_PARTITION = "unknown_partition"
    UNKNOWN_QOS = "unknown_qos"
    UNKNOWN_ACCOUNT = "unknown_account"
    UNKNOWN_USER = "unknown_user"
    USER_NOT_IN_ACCOUNT = "user_not_in_account"
    ACCOUNT_NOT_ALLOWED = "account_not_allowed"
    QOS_NOT_ALLOWED = "qos_not_allowed"
    TIME_OVER_MAX = "time_over_max"
    TOO_MANY_NODES = "too_many_nodes"
    TOO_MANY_GPUS_PER_NODE = "too_many_gpus_per_node"
    TOO_MANY_GPUS = "too_many_gpus"
    NO_MATCHING_NODES = "no_matching_nodes"
    UNKNOWN_NODE = "unknown_node"
    SUBMIT_LIMIT = "submit_limit"
    NOT_PERMITTED = "not_permitted"


class SubmitError(msgspec.Struct, frozen=True, kw_only=True):
    """One reason a submission is refused."""

    code: ErrorCode
    message: str
    field: str = ""

    def __str__(self) -> str:
        return self.message
