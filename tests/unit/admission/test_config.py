"""Cluster configuration: the shipped file loads; each mistake names its key."""

from __future__ import annotations

import pytest

from services.admission.config import ConfigError, load_config
from services.admission.config_model import PreemptMode
from services.admission.config_read import ConfigProblem

from .builders import local_config

MINIMAL = """
[partitions.normal]
nodes = "node[01-02]"
max_time = "1:00:00"
"""


def test_the_local_cluster_file_has_the_four_common_queues() -> None:
    config = local_config()
    assert list(config.partitions) == ["debug", "normal", "large", "inference"]
    debug, normal, large, inference = config.partitions.values()
    assert (debug.max_time_s, debug.reserved_gpus, debug.node_names) == (1800, 2, ("node04",))
    assert debug.priority_tier == max(p.priority_tier for p in config.partitions.values())
    assert (normal.max_gpus_per_job, normal.max_time_s) == (32, 72 * 3600)
    assert (large.max_gpus_per_job, large.requires_approval, large.max_time_s) == (
        None,
        True,
        14 * 86400,
    )
    assert inference.preempt_mode is PreemptMode.OFF
    assert set(inference.can_preempt) == {"normal", "large"}
    assert normal.node_names == ("node01", "node02", "node03", "node04")
    assert list(config.qos) == ["high", "normal", "low"]
    assert {a: (x.parent, x.shares) for a, x in config.accounts.items()} == {
        "root": (None, 1),
        "research": ("root", 70),
        "prod": ("root", 30),
    }
    assert config.users["bob"].default_account == "research"
    assert config.billing.weight("H100") == 2.0
    assert config.billing.weight(None) == 1.0


def test_a_minimal_file_gets_defaults() -> None:
    config = load_config(MINIMAL)
    assert config.default_partition == "normal"
    assert config.default_qos == "normal"
    assert config.partitions["normal"].default_time_s == 3600
    assert config.accounts == {}


def test_node_sets_and_all() -> None:
    config = load_config(
        '[node_sets]\nfast = ["n[1-2]", "m1"]\n[partitions.a]\nnodes = ["fast", "z9"]\n'
        '[partitions.b]\nnodes = "ALL"\n'
    )
    assert config.partitions["a"].node_names == ("n1", "n2", "m1", "z9")
    assert config.partitions["b"].node_names is None


def problems(text: str) -> tuple[ConfigProblem, ...]:
    with pytest.raises(ConfigError) as caught:
        load_config(text)
    return caught.value.problems


MISTAKES = {
    "not TOML at all": ("[partitions", "<file>", "not valid TOML"),
    "an unknown top-level table": (MINIMAL + "[queues]\n", "queues", "accepted here: cluster,"),
    "an unknown partition key": (
        MINIMAL + "maxtime = 5\n",
        "partitions.normal.maxtime",
        "unknown key; accepted here: nodes, default_time, max_time",
    ),
    "a duration as a number": (
        MINIMAL + "default_time = 30\n",
        "partitions.normal.default_time",
        'expected a duration string (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S), e.g. "72:00:00"',
    ),
    "a bad preempt mode": (
        MINIMAL + 'preempt_mode = "suspend"\n',
        "partitions.normal.preempt_mode",
        "expected one of off, requeue, cancel, got 'suspend'",
    ),
    "a negative GPU cap": (
        MINIMAL + "max_gpus_per_job = -1\n",
        "partitions.normal.max_gpus_per_job",
        "expected a whole number of at least 1, got -1",
    ),
    "a default time over the maximum": (
        MINIMAL + 'default_time = "2:00:00"\n',
        "partitions.normal.default_time",
        "is longer than max_time",
    ),
    "a bad hostlist": (
        '[partitions.a]\nnodes = "n[2-1]"\n',
        "partitions.a.nodes",
        "runs backwards; expected ALL, a node_sets label (none defined) or a hostlist",
    ),
    "preempting an unknown partition": (
        MINIMAL + 'can_preempt = ["gpu"]\n',
        "partitions.normal.can_preempt",
        "no partition 'gpu'; defined: normal",
    ),
    "a default partition that does not exist": (
        '[cluster]\ndefault_partition = "gpu"\n' + MINIMAL,
        "cluster.default_partition",
        "no partition 'gpu'; defined: normal",
    ),
    "a QOS preempting an unknown QOS": (
        MINIMAL + '[qos.normal]\npreempt = ["scavenger"]\n',
        "qos.normal.preempt",
        "no QOS 'scavenger'; defined: normal",
    ),
    "an account with an unknown parent": (
        MINIMAL + '[accounts.root]\n[accounts.ml]\nparent = "rot"\nshares = 5\n',
        "accounts.ml.parent",
        "no account 'rot'; defined: root, ml",
    ),
    "two roots": (
        MINIMAL + "[accounts.a]\n[accounts.b]\n",
        "accounts",
        "exactly one root",
    ),
    "zero shares": (
        MINIMAL + "[accounts.root]\nshares = 0\n",
        "accounts.root.shares",
        "at least 1",
    ),
    "a user in an unknown account": (
        MINIMAL + '[accounts.root]\n[users.ann]\naccounts = ["ml"]\n',
        "users.ann.accounts",
        "no account 'ml'; defined: root",
    ),
    "a default account the user is not in": (
        MINIMAL
        + '[accounts.root]\n[accounts.x]\nparent = "root"\n'
        + '[users.ann]\naccounts = ["root"]\ndefault_account = "x"\n',
        "users.ann.default_account",
        "'x' is not one of this user's accounts: root",
    ),
    "a partition allowing an unknown account": (
        MINIMAL + 'allowed_accounts = ["ml"]\n[accounts.root]\n',
        "partitions.normal.allowed_accounts",
        "no account 'ml'",
    ),
    "a negative billing weight": (
        MINIMAL + "[billing]\ngpu_weights = { H100 = -1 }\n",
        "billing.gpu_weights",
        "expected a table of GPU model = weight (0 or more)",
    ),
    "operators as a number": (MINIMAL + "[roles]\noperators = 3\n", "roles.operators", "list"),
    "no partition at all": ("[cluster]\nname = 'x'\n", "partitions", "at least one partition"),
    "a reservation with a start that is no date": (
        MINIMAL + "[reservations.r]\nstart = 'monday'\nduration = '1:00:00'\nmaintenance = true\n",
        "reservations.r.start",
        "write e.g. 2026-12-01T08:00:00Z",
    ),
    "a reservation nobody may use that is not maintenance": (
        MINIMAL + "[reservations.r]\nstart = 2026-12-01T08:00:00Z\nduration = '1:00:00'\n",
        "reservations.r.accounts",
        "name the accounts that may run inside, or set maintenance",
    ),
    "a default memory that is not a size": (
        MINIMAL + 'def_mem_per_gpu = "lots"\n',
        "partitions.normal.def_mem_per_gpu",
        'expected a memory size above 0: MiB, or "8G", "512M"',
    ),
    "default memory per GPU and per CPU both": (
        MINIMAL + 'def_mem_per_gpu = "8G"\ndef_mem_per_cpu = 2048\n',
        "partitions.normal.def_mem_per_cpu",
        "give one of def_mem_per_gpu and def_mem_per_cpu",
    ),
    "a reservation without a duration": (
        MINIMAL + "[reservations.r]\nstart = 2026-12-01T08:00:00Z\nmaintenance = true\n",
        "reservations.r.duration",
        "a reservation needs duration",
    ),
}


@pytest.mark.parametrize(("text", "key", "message"), MISTAKES.values(), ids=MISTAKES.keys())
def test_mistakes_name_the_key_and_what_is_accepted(text: str, key: str, message: str) -> None:
    found = [p for p in problems(text) if p.key == key]
    assert found, problems(text)
    assert message in found[0].message


def test_every_problem_is_reported_at_once() -> None:
    text = MINIMAL + "bogus = 1\nmax_nodes = 0\n[qos.normal]\npriority = 'high'\n"
    assert [p.key for p in problems(text)] == [
        "partitions.normal.bogus",
        "partitions.normal.max_nodes",
        "qos.normal.priority",
    ]
    with pytest.raises(ConfigError, match=r"3 problem\(s\)"):
        load_config(text)


def test_a_weekly_maintenance_window_and_an_account_reservation_load() -> None:
    config = load_config(
        MINIMAL
        + """
[reservations.patch]
start = 2026-12-01T02:00:00Z
duration = "2:00:00"
recurrence = "weekly"
maintenance = true

[reservations.llm]
start = "2026-12-02T08:00:00+01:00"
duration = "1-00:00:00"
nodes = ["node[01-02]"]
accounts = ["research"]
"""
    )
    patch, llm = config.reservations["patch"], config.reservations["llm"]
    assert (patch.start, patch.duration_s, patch.recurrence) == (1796090400.0, 7200, "weekly")
    assert patch.maintenance and patch.nodes == ()
    assert (llm.start, llm.nodes, llm.accounts) == (
        1796194800.0,
        ("node01", "node02"),
        ("research",),
    )
