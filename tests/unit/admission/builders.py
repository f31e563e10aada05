"""Builders shared by the admission unit tests: expected JobSpecs and script files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.admission.cluster_shape import ClusterShape, NodeShape, shape
from services.admission.config import load_config
from services.admission.config_model import ClusterConfig
from shared.jobspec import JobSpec

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).parents[3]
USER = "alice"
HOME = "/home/alice"
NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def script(name: str) -> bytes:
    return (SCRIPTS / name).read_bytes()


def job(file: str, /, **fields: Any) -> JobSpec:
    """What parsing script `file` with no options should give, plus `fields`."""
    text = script(file).decode().replace("\r\n", "\n")
    base: dict[str, Any] = {
        "name": file,
        "user": USER,
        "script": text,
        "script_name": file,
        "workdir": HOME,
    }
    return JobSpec(**(base | fields))


def local_config() -> ClusterConfig:
    return load_config((REPO / "deploy" / "local" / "cluster.toml").read_text())


def node(name: str, gpus: int = 4, model: str | None = "SIM", *features: str) -> NodeShape:
    return NodeShape(name=name, gpus=gpus, gpu_model=model, features=features)


def local_cluster(config: ClusterConfig | None = None) -> ClusterShape:
    """node01..node04 with 4 simulated GPUs each, as `muster up` starts them."""
    return shape(config or local_config(), [node(f"node0{i}") for i in range(1, 5)])
