"""Pure: who may see which of another user's data (Slurm's PrivateData).

The cluster configuration's `[cluster] private_data` lists what is private; by default
everything below is. Private data of a job is visible to its owner, the coordinators of
its account (and of the accounts above it) and operators; everyone else gets it hidden
(a job left out of `queue`, `show` refused, a script redacted, accounting rows left out).
"""

from __future__ import annotations

from enum import StrEnum

from shared.identity import Directory


class PrivateData(StrEnum):
    JOBS = "jobs"  # other users' jobs: `queue` lists them, `show` shows them
    SCRIPTS = "scripts"  # a job's script and environment in `show`
    USAGE = "usage"  # `acct` records and `share` rows of other users


DEFAULT_PRIVATE = frozenset(PrivateData)
REDACTED = "<private: visible to its owner, their account's coordinators and operators>"


def may_see(
    actor: str, owner: str, account: str | None, what: PrivateData, directory: Directory
) -> bool:
    """Whether `actor` may see `what` of data that belongs to `owner` in `account`."""
    if what not in directory.private or actor == owner or actor in directory.operators:
        return True
    return account is not None and directory.coordinates(actor, account)


# The fields of a job's spec that hold a script, its environment or what it was given.
SCRIPT_FIELDS = ("script", "args", "env", "export")


def redact_spec(spec: dict[str, object]) -> dict[str, object]:
    """The spec of another user's job as `show` returns it when scripts are private:
    each private field replaced (not dropped, so the spec still decodes)."""
    blank: dict[str, object] = {"script": REDACTED, "args": [], "env": {}, "export": "NONE"}
    return {**spec, **{k: blank[k] for k in SCRIPT_FIELDS if k in spec}}
