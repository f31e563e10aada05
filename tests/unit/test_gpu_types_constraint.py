"""Table tests: GPU type names derived from NVML models, and --constraint expressions."""

from __future__ import annotations

import pytest

from shared.constraint import Constraint, Term, feasible, node_fits, parse
from shared.gpu_types import gpu_matches, gpu_type

TYPES = {
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H100 PCIe": "h100",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA A100-PCIE-40GB": "a100",
    "Tesla V100-SXM2-16GB": "v100",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA L40S": "l40s",
    "NVIDIA RTX A6000": "a6000",
    "NVIDIA GeForce RTX 4090": "rtx4090",
    "AMD Instinct MI250X": "mi250x",
    "SIM-H100": "h100",
    "SIM": "sim",
    "": "",
}


@pytest.mark.parametrize(("model", "want"), TYPES.items())
def test_the_short_type_is_the_product_part_in_lower_case(model: str, want: str) -> None:
    assert gpu_type(model) == want


def test_a_request_names_the_type_or_the_model_in_any_case() -> None:
    model = "NVIDIA H100 80GB HBM3"
    assert gpu_matches("h100", model)
    assert gpu_matches("H100", model)
    assert gpu_matches("nvidia h100 80gb hbm3", model)
    assert gpu_matches("nvidia_h100_80gb_hbm3", model)  # as a GRES type has no spaces
    assert gpu_matches("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB")  # without the vendor
    assert not gpu_matches("a100", model)
    assert gpu_matches("hopper", model, "hopper")
    assert not gpu_matches("h100", model, "hopper")
    assert not gpu_matches("h100", None)


PARSED = {
    "ib": Constraint(alternatives=((Term("ib"),),)),
    "a100&ib": Constraint(alternatives=((Term("a100"), Term("ib")),)),
    "a100&ib|h100": Constraint(alternatives=((Term("a100"), Term("ib")), (Term("h100"),))),
    "[rack1|rack2]": Constraint(alternatives=((Term("rack1"),), (Term("rack2"),)), matching=True),
    "ib&big*2": Constraint(alternatives=((Term("ib"), Term("big", 2)),)),
    "[rack1*2&rack2*4]": Constraint(
        alternatives=((Term("rack1", 2), Term("rack2", 4)),), matching=True
    ),
}


@pytest.mark.parametrize(("text", "want"), PARSED.items())
def test_constraints_parse(text: str, want: Constraint) -> None:
    assert parse(text) == want


@pytest.mark.parametrize("text", ["", "a&", "(a|b)&c", "a*0", "a**2", "a b", "[a|b"])
def test_malformed_constraints_are_refused_with_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="expected FEATURE"):
        parse(text)


NODES = [("ib", "rack1", "big"), ("ib", "rack1"), ("ib", "rack2", "big"), ("rack2",)]
FEASIBLE = {
    "every node has ib, three needed": ("ib", 3, True),
    "only three nodes have ib": ("ib", 4, False),
    "two nodes with big among three with ib": ("ib&big*2", 3, True),
    "three with big asked, two exist": ("ib&big*3", 3, False),
    "one rack holds two nodes": ("[rack1|rack2]", 2, True),
    "no rack holds three nodes": ("[rack1|rack2]", 3, False),
    "a plain OR mixes racks": ("rack1|rack2", 4, True),
    "counts over both racks": ("[rack1*2&rack2*2]", 4, True),
    "one node does not meet two counts": ("rack2*2&big*2", 4, False),
}


@pytest.mark.parametrize("name", FEASIBLE)
def test_feasibility_counts_nodes_together(name: str) -> None:
    text, needed, want = FEASIBLE[name]
    c = parse(text)
    fitting = [n for n in NODES if node_fits(n, c)]
    assert feasible(c, fitting, needed) is want
