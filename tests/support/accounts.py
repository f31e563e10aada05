"""The run-as test account: created (or found) in one place, described by `pwd`.

Tests that run a job as another user ask for `run_as_account()`; they assert what the
password database says about the account (its uid, gid and home), never a literal, so a
run passes whether the account existed before, with any home, in any test order.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass

TEST_USER = "musterjob"


class AccountUnavailable(Exception):
    """The account cannot be made here (not root, or no useradd): the caller skips."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def run_as_account(name: str = TEST_USER) -> Account:
    """The test account, created without a home folder if it does not exist yet."""
    if os.geteuid() != 0:
        raise AccountUnavailable("run-as-user needs root: the agent drops to the user's ids")
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if shutil.which("useradd") is None:
            raise AccountUnavailable(
                "useradd is not installed: cannot create the test account"
            ) from None
        # Another test process may create it at the same moment: useradd's exit 9 (the
        # name is taken) then means it exists, which is all this needs.
        done = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode not in (0, 9):
            raise AccountUnavailable(f"useradd {name} failed: {done.stderr.strip()}") from None
        entry = pwd.getpwnam(name)
    return Account(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, home=entry.pw_dir)
