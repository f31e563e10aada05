"""Where the reference GPU-cluster traces are: `MUSTER_TRACES`, else `../shared/traces`.

The traces are not part of the repository; they sit beside the checkout (`../shared/traces`
relative to the repository root), or wherever `MUSTER_TRACES` names. Callers that need
them and find none say so and stop: no stand-in data is ever used silently.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BESIDE_THE_REPO = REPO.parent / "shared" / "traces"


class TracesMissing(Exception):
    def __init__(self, looked_in: Path) -> None:
        super().__init__(
            f"no reference traces in {looked_in}: put them at ../shared/traces beside the "
            "repository or set MUSTER_TRACES to their folder"
        )
        self.looked_in = looked_in


def traces_root(env: Mapping[str, str] | None = None) -> Path:
    """The traces folder; raises TracesMissing if it is not there."""
    named = (os.environ if env is None else env).get("MUSTER_TRACES")
    root = Path(named) if named else BESIDE_THE_REPO
    if not root.is_dir():
        raise TracesMissing(root)
    return root
