"""Entry point: `python -m services.fairshare`.

`MUSTER_CLUSTER_CONFIG` names the cluster configuration (account tree, billing weights,
QOS and partition priorities); `MUSTER_FAIRSHARE_CONFIG` an optional TOML file with the
fair-share knobs (`FairShareConfig`, see docs/fairshare.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from services.fairshare.cluster import ClusterView, read_cluster
from services.fairshare.config import FairShareConfig, decode_config
from services.fairshare.service import FairShare
from services.fairshare.tree import check_tree
from shared.runtime import serve_process
from shared.settings import FairShareSettings


def load(settings: FairShareSettings) -> tuple[FairShareConfig, ClusterView]:
    config = FairShareConfig()
    if settings.fairshare_config:
        config = decode_config(Path(settings.fairshare_config).read_text())
    cluster = ClusterView()
    if settings.cluster_config:
        cluster = read_cluster(Path(settings.cluster_config).read_text())
        issues = check_tree(cluster.tree)
        if issues:
            raise SystemExit(f"{settings.cluster_config}: account tree is unusable: {issues}")
    return config, cluster


def main() -> None:
    settings = FairShareSettings.from_env(os.environ)
    config, cluster = load(settings)
    serve_process(settings, lambda ctx: FairShare(ctx, config, cluster))


if __name__ == "__main__":
    main()
