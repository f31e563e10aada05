"""`scontrol show hostnames` / `hostlist` / `hostlistsorted` (muster/hostnames.py): a
hostlist into one name a line, in the order written (the job's own without one), and
names (a list or a file) into one expression; each mistake said with what to write."""

from __future__ import annotations

import pytest

from muster.hostnames import HostlistError, show

JOB = {"SLURM_JOB_NODELIST": "gpu[07-08],login1"}
FILES = {"/etc/hosts.txt": "node02\nnode01 node03\n\n"}


def read(path: str) -> str:
    if path not in FILES:
        raise FileNotFoundError(2, "No such file or directory")
    return FILES[path]


@pytest.mark.parametrize(
    ("entity", "args", "env", "lines"),
    [
        ("hostnames", ["node[01-02],gpu7"], {}, ["node01", "node02", "gpu7"]),
        ("hostnames", [], JOB, ["gpu07", "gpu08", "login1"]),  # the job's own
        ("hostname", ["node[3,1]"], JOB, ["node3", "node1"]),  # the order written
        ("hostlist", ["node03,node01,node02"], {}, ["node[01-03]"]),
        ("hostlistsorted", ["b2,a1,b1"], {}, ["a1,b[1-2]"]),
        ("hostlist", ["/etc/hosts.txt"], {}, ["node[01-03]"]),  # a file, as Slurm's
    ],
)  # fmt: skip
def test_what_scontrol_show_prints(
    entity: str, args: list[str], env: dict[str, str], lines: list[str]
) -> None:
    assert show(entity, args, env, read) == lines


@pytest.mark.parametrize(
    ("entity", "args", "said"),
    [
        ("hostnames", [], "no hostlist given and SLURM_JOB_NODELIST is not set"),
        ("hostnames", ["node[1-"], "invalid hostlist 'node[1-': '[' is never closed"),
        ("hostnames", ["a", "b"], "show hostnames takes one list, not 2: join them with ','"),
        ("hostlist", [], "show hostlist needs names: node01,node02"),
        ("hostlist", ["/nope"], "cannot read /nope: No such file or directory"),
        ("hostlist", [","], "show hostlist: ',' names no host"),
    ],
)
def test_a_mistake_says_what_to_write(entity: str, args: list[str], said: str) -> None:
    with pytest.raises(HostlistError) as err:
        show(entity, args, {}, read)
    assert str(err.value).startswith(said), str(err.value)
