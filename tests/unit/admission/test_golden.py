"""Golden snapshots: the shipped config and a full pretraining job, as JSON.

Other services read both shapes (the JobSpec from the jobs table, the config for
preemption and billing). The snapshot is decoded into today's type and compared, so a
field added elsewhere with a default does not break it, while a changed value does.
After an intended change, regenerate with `MUSTER_REGOLD=1 pytest tests/unit/admission`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from services.admission.sbatch import parse_submission
from services.admission.validate import admit

from .builders import HOME, NOW, local_cluster, local_config, script

GOLDEN = Path(__file__).parent / "golden"


def check(name: str, value: msgspec.Struct) -> None:
    path = GOLDEN / name
    if os.environ.get("MUSTER_REGOLD") or not path.exists():
        path.write_text(json.dumps(msgspec.to_builtins(value), indent=2, sort_keys=True) + "\n")
        pytest.skip(f"wrote {path}")
    assert msgspec.json.decode(path.read_bytes(), type=type(value)) == value


def test_local_cluster_config_snapshot() -> None:
    check("local_cluster_config.json", local_config())


def test_admitted_pretraining_job_snapshot() -> None:
    config = local_config()
    parsed = parse_submission(
        ["-A", "research", "-q", "normal", "-N", "2", "--gpus-per-node", "4", "--mem", "64G"],
        script("llm_pretrain.sbatch"),
        user="bob",
        workdir=HOME,
        script_path=f"{HOME}/llm_pretrain.sbatch",
        now=NOW,
    )
    assert parsed.spec is not None
    got = admit(parsed.spec, parsed.explicit, config, local_cluster(config))
    assert got.errors == ()
    assert got.spec is not None
    check("admitted_pretraining_job.json", got.spec)
