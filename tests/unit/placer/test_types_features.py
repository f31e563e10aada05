"""Table tests: GPU types and --constraint pick the nodes a job may start on.

A request names a GPU by its short type ("h100", derived from the NVML model or set
in the config) or its full model, in any case; a constraint admits nodes by feature,
and a matching OR (`[a|b]`) keeps all of a job's nodes in one alternative.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.placer.core import Node, Waiting, place
from tests.unit.placer.helpers import T0, gang, node, snapshot


def featured(name: str, model: str, *features: str, gpu_type: str | None = None) -> Node:
    return msgspec.structs.replace(node(name, 4, model=model), features=features, gpu_type=gpu_type)


NODES = (
    featured("a1", "NVIDIA A100-SXM4-80GB", "ib", "rack1"),
    featured("a2", "NVIDIA A100-SXM4-80GB", "rack2"),
    featured("h1", "NVIDIA H100 80GB HBM3", "ib", "rack1"),
    featured("h2", "NVIDIA H100 80GB HBM3", "ib", "rack2"),
    featured("h3", "NVIDIA H100 80GB HBM3", "ib", "rack2"),
    featured("s1", "SIM-H100", gpu_type="sim-big"),
)

# name -> (the job's request, the nodes it starts on; () means it waits)
CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "a short type matches the NVML model": ({"gpu_model": "a100", "nodes": 2}, ("a1", "a2")),
    "a type in any case": ({"gpu_model": "A100", "nodes": 1}, ("a1",)),
    "the full model matches too": (
        {"gpu_model": "nvidia h100 80gb hbm3", "nodes": 3},
        ("h1", "h2", "h3"),
    ),
    "a configured type replaces the derived one": ({"gpu_model": "sim-big"}, ("s1",)),
    "an AND of features": ({"constraint": "ib&rack2", "nodes": 2}, ("h2", "h3")),
    "an OR of features": (
        {"constraint": "rack1|rack2", "nodes": 5},
        ("a1", "a2", "h1", "h2", "h3"),
    ),
    "a type and a feature together": ({"gpu_model": "h100", "constraint": "rack1"}, ("h1",)),
    "a matching OR keeps the job in one rack": (
        {"constraint": "[rack1|rack2]", "nodes": 3},
        ("a2", "h2", "h3"),
    ),
    "no node has the feature: the job waits": ({"constraint": "nvlink"}, ()),
}


@pytest.mark.parametrize("name", CASES)
def test_types_and_features_choose_the_nodes(name: str) -> None:
    ask, want = CASES[name]
    ask = dict(ask)
    nodes = ask.pop("nodes", 1)
    plan = place(snapshot(*NODES), [gang(1, nodes=nodes, gpus_per_node=4, **ask)], T0)
    started = tuple(sorted(g.node for s in plan.starts for g in s.grants))
    assert started == want
    if not want:
        assert [w.reason for w in plan.waits] == [Waiting.BAD_CONSTRAINTS]
