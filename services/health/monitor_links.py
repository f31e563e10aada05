"""Pure: the links that keep a node out of multi-node jobs (monitor_core's part for a
fabric fault whose catalog action is `exclude_multi_node`: errors rising, a link trained
down to a lower speed).

Such a node stays UP: single-node work never touches its fabric. `NodeHealth.
multi_node_excluded` maps each such link to what shows it; the placer leaves a node
with any entry out of every multi-node placement (placer/core/fabric.py). An entry is
set by the fault, dropped when the probe reports the link stable again (or no longer
names it among its faulted links, `faulted`, in any fabric report), and all of them by
an operator's resume. While any lasts, an UP node's reason says so (`muster nodes`).
"""

from __future__ import annotations

from services.health.catalog import FabricClassification
from services.health.monitor_model import NodeHealth
from services.health.monitor_moves import with_changes
from shared.states import NodeState

EXCLUDED_REASON = "multi-node excluded: "


def excluded_by(node: NodeHealth, c: FabricClassification) -> NodeHealth:
    """`c.link` keeps the node out of multi-node jobs from now on."""
    what = c.condition.replace("_", " ") + (f": {c.detail}" if c.detail else "")
    links = {**node.multi_node_excluded, c.link: what}
    return with_changes(node, multi_node_excluded=links)


def still_faulted(node: NodeHealth, faulted: tuple[str, ...], cleared: str = "") -> NodeHealth:
    """Keep only the entries of links the probe still holds at fault (`faulted`, all of
    its links at fault after this report), less the one it says is `cleared`."""
    keep = {k: v for k, v in node.multi_node_excluded.items() if k in faulted and k != cleared}
    if keep == node.multi_node_excluded:
        return node
    return with_changes(node, multi_node_excluded=keep)


def shown(node: NodeHealth) -> NodeHealth:
    """An UP node's reason names the links keeping it out of multi-node jobs, and is
    emptied when the last one clears; other states keep their own reason."""
    if node.state is not NodeState.UP:
        return node
    if node.multi_node_excluded:
        links = sorted(node.multi_node_excluded.items())
        text = EXCLUDED_REASON + "; ".join(f"{link} {what}" for link, what in links)
        return node if node.reason == text else with_changes(node, reason=text)
    if node.reason.startswith(EXCLUDED_REASON):
        return with_changes(node, reason="")
    return node
