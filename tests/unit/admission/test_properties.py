"""Properties: the parser, the config loader and admission never raise on any input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.admission.config import ConfigError, load_config
from services.admission.options import TABLE
from services.admission.sbatch import parse_submission, split_command_line
from services.admission.validate import admit

from .builders import NOW, local_cluster, local_config

CONFIG = local_config()
CLUSTER = local_cluster(CONFIG)

option_words = st.sampled_from(
    [f"--{s.long}" for s in TABLE] + [f"-{s.short}" for s in TABLE if s.short]
)
values = st.sampled_from(
    [
        "2",
        "-1",
        "0",
        "1-2",
        "4:8",
        "gpu:a100:2",
        "1:00:00",
        "UNLIMITED",
        "x",
        "",
        "n[1-3]",
        "afterok:1",
        "0-7%2",
        "now+1hour",
        "B:USR1@60",
        "64G",
        "a,b",
        "ALL,X=1",
        "%",
        "[",
        "?",
    ]
)
argv = st.lists(st.one_of(option_words, values, st.text(max_size=12)), max_size=12)
directive_lines = st.builds(
    lambda prefix, words: f"{prefix} {' '.join(words)}",
    st.sampled_from(["#SBATCH", "#MUSTER", "#SBATCH\t", "# SBATCH", "#SBATCHX"]),
    st.lists(st.one_of(option_words, values), max_size=4),
)
scripts = st.one_of(
    st.text(max_size=200),
    st.binary(max_size=200),
    st.builds(
        lambda lines, ending: "#!/bin/bash" + ending + ending.join(lines),
        st.lists(st.one_of(directive_lines, st.text(max_size=30)), max_size=8),
        st.sampled_from(["\n", "\r\n", "\r"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(argv, scripts)
def test_parsing_and_admitting_never_raise(words: list[str], script: str | bytes) -> None:
    got = parse_submission(words, script, user="alice", workdir="/w", now=NOW)
    assert (got.spec is None) == bool(got.errors)
    if got.spec is not None:
        result = admit(got.spec, got.explicit, CONFIG, CLUSTER)
        assert (result.spec is None) == bool(result.errors)


@given(st.lists(st.one_of(option_words, values, st.text(max_size=8)), max_size=10))
def test_split_command_line_never_raises(words: list[str]) -> None:
    split = split_command_line(words)
    assert len(split.options) + (split.script is not None) + len(split.args) <= len(words)


toml_values = st.sampled_from(
    [
        '"x"',
        "1",
        "-1",
        "0",
        "true",
        '"1:00:00"',
        '"UNLIMITED"',
        '["normal"]',
        '[1, "a"]',
        '"node[01-04]"',
        '"n[2-1]"',
        '"off"',
        '"ALL"',
        "{ H100 = 2 }",
        "[]",
        '"root"',
        "1.5",
    ]
)
keys = st.sampled_from(
    [
        "nodes",
        "max_time",
        "default_time",
        "max_nodes",
        "preempt_mode",
        "can_preempt",
        "parent",
        "shares",
        "accounts",
        "default_account",
        "preempt",
        "priority",
        "operators",
        "bogus",
        "allowed_accounts",
        "default_partition",
        "gpu_weights",
        "reserved_gpus",
        "min_runtime",
    ]
)
tables = st.sampled_from(
    [
        "[cluster]",
        "[partitions.a]",
        "[partitions.b]",
        "[qos.normal]",
        "[accounts.root]",
        "[accounts.ml]",
        "[users.u]",
        "[roles]",
        "[billing]",
        "[node_sets]",
        "[other]",
    ]
)
toml_files = st.lists(
    st.builds(
        lambda table, pairs: table + "\n" + "".join(f"{k} = {v}\n" for k, v in pairs.items()),
        tables,
        st.dictionaries(keys, toml_values, max_size=4),
    ),
    max_size=6,
    unique_by=lambda block: block.split("\n")[0],
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), toml_files.map("\n".join)))
def test_config_loader_raises_only_config_errors(text: str) -> None:
    try:
        config = load_config(text)
    except ConfigError as err:
        assert err.problems
        return
    # An identity-only file (users, keys, roles; no policy) is valid without partitions.
    assert config.default_partition in config.partitions or not config.partitions
