"""Shell: the fabric links the cluster configuration names for this node
(`[node_sets.X] fabric = [...]`, services/admission/config_fabric.py), read by the node
agent at start from `MUSTER_CLUSTER_CONFIG`, as slurmd reads its node's line of
slurm.conf. Which links an agent watches, first that says:

    MUSTER_FABRIC (the agent's own setting; a `muster up` topology leaf's `fabric`)
    the cluster configuration's node sets that hold this node
    every HCA the agent finds (autodetection)

A configuration the agent cannot read or that does not load is logged, and the agent
autodetects: a typo elsewhere in the file must not stop a node's agent.
"""

from __future__ import annotations

import logging
from pathlib import Path

from services.admission.config import ConfigError, load_config
from shared.logs import kv
from shared.settings import NodeSettings

log = logging.getLogger(__name__)


def configured_fabric(settings: NodeSettings) -> tuple[str, ...]:
    """The links the configuration's node sets give this node; () when MUSTER_FABRIC
    names them already, or no configuration names any."""
    if settings.fabric or not settings.cluster_config:
        return ()
    try:
        text = Path(settings.cluster_config).read_text()
    except OSError as err:
        log.warning("cluster config unreadable: fabric autodetected", extra=kv(error=str(err)))
        return ()
    return fabric_of(text, settings.node)


def fabric_of(text: str, node: str) -> tuple[str, ...]:
    """`node`'s fabric links in the configuration `text` (() when none are named)."""
    try:
        config = load_config(text)
    except ConfigError as err:
        log.warning(
            "cluster config invalid: fabric autodetected", extra=kv(node=node, error=str(err))
        )
        return ()
    traits = config.node_traits.get(node)
    return traits.fabric if traits is not None else ()
