"""`fabric = [...]` per node set in the cluster configuration: the links each node's
agent watches, parsed and checked (a bad value names its key and says what to write),
and how an agent picks its links (MUSTER_FABRIC, else the configuration, else every
HCA it finds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from muster.node_fabric import configured_fabric, fabric_of
from services.admission.config import ConfigError, load_config
from services.admission.config_read import ConfigProblem
from services.health.fabric import watcher_from
from shared.settings import NodeSettings

PARTITION = '\n[partitions.normal]\nnodes = "ALL"\n'

GOOD = {
    "an HCA, one port of another and an interface": (
        '[node_sets.gpu]\nnodes = "node[01-02]"\nfabric = ["mlx5_0", "mlx5_1/1", "ib0"]\n',
        {"node01": ("mlx5_0", "mlx5_1/1", "ib0"), "node02": ("mlx5_0", "mlx5_1/1", "ib0")},
    ),
    "a node in two sets watches the links of both, once each": (
        '[node_sets.a]\nnodes = "node[01-02]"\nfabric = ["mlx5_0", "ib0"]\n'
        '[node_sets.b]\nnodes = "node02"\nfabric = ["ib0", "eth1"]\n',
        {"node01": ("mlx5_0", "ib0"), "node02": ("mlx5_0", "ib0", "eth1")},
    ),
    "unset or empty: nothing named, the agent autodetects its HCAs": (
        '[node_sets.a]\nnodes = "node01"\nfeatures = ["h100"]\n'
        '[node_sets.b]\nnodes = "node02"\nfabric = []\n',
        {"node01": (), "node02": ()},
    ),
}


@pytest.mark.parametrize(("text", "want"), GOOD.values(), ids=GOOD.keys())
def test_node_set_fabric(text: str, want: dict[str, tuple[str, ...]]) -> None:
    config = load_config(text + PARTITION)
    got = {n: t.fabric for n, t in config.node_traits.items()}
    assert {n: got.get(n, ()) for n in want} == want
    assert {n: fabric_of(text + PARTITION, n) for n in want} == want


BAD = {
    "a string, not a list": (
        'fabric = "mlx5_0"',
        "expected a list of HCA, HCA/port or interface names "
        '(e.g. fabric = ["mlx5_0", "mlx5_1/1", "ib0"]), got \'mlx5_0\'',
    ),
    "a number in the list": (
        'fabric = ["mlx5_0", 1]',
        "expected a list of HCA, HCA/port or interface names "
        '(e.g. fabric = ["mlx5_0", "mlx5_1/1", "ib0"]), got [\'mlx5_0\', 1]',
    ),
    "two links in one string": (
        'fabric = ["mlx5_0, ib0"]',
        "'mlx5_0, ib0' is not a link name: give an HCA (mlx5_0), one of its ports "
        "(mlx5_0/1) or an interface (ib0), without spaces or commas",
    ),
    "port 0 (ports count from 1)": (
        'fabric = ["mlx5_0/0"]',
        "'mlx5_0/0' is not a link name: give an HCA (mlx5_0), one of its ports "
        "(mlx5_0/1) or an interface (ib0), without spaces or commas",
    ),
}


@pytest.mark.parametrize(("line", "message"), BAD.values(), ids=BAD.keys())
def test_a_bad_fabric_value_names_its_key_and_what_to_write(line: str, message: str) -> None:
    text = f'[node_sets.gpu]\nnodes = "node01"\n{line}\n' + PARTITION
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert err.value.problems == (ConfigProblem("node_sets.gpu.fabric", message),)
    assert fabric_of(text, "node01") == ()  # an agent autodetects instead of stopping


def test_the_agent_takes_its_own_setting_then_the_configuration_then_autodetects(
    tmp_path: Path,
) -> None:
    config = tmp_path / "cluster.toml"
    config.write_text('[node_sets.gpu]\nnodes = "node01"\nfabric = ["mlx5_1", "ib1"]\n' + PARTITION)

    def links(node: str = "node01", path: Path = config, fabric: str = "") -> tuple[str, ...]:
        settings = NodeSettings(node=node, cluster_config=str(path), fabric=fabric)
        return watcher_from(settings, lambda: 0.0, configured_fabric(settings)).names

    assert links() == ("mlx5_1", "ib1")
    assert links(fabric="mlx5_0") == ("mlx5_0",)  # MUSTER_FABRIC (a topology leaf's too)
    assert links(node="node02") == ()  # in no set that names links: every HCA found
    assert links(path=tmp_path / "missing.toml") == ()
