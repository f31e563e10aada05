"""`muster.client_env.local_ids`: the ids scontrol's `UserId=` and `GroupId=` show."""

from __future__ import annotations

import grp
import os
import pwd

from muster.client_env import local_ids


def test_a_known_user_has_its_uid_group_and_gid() -> None:
    me = pwd.getpwuid(os.getuid())
    assert local_ids(me.pw_name) == (me.pw_uid, grp.getgrgid(me.pw_gid).gr_name, me.pw_gid)


def test_a_user_this_machine_has_no_account_of_has_none() -> None:
    assert local_ids("no-such-muster-user") is None
