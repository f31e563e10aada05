"""Pure: which of a requeued run's excluded nodes still keep it out.

The launcher requeues a job without the node that failed it (an XID, a lost node, a
refused start). An exclusion stands until that node comes back UP after it: a reboot, a
repair, an operator's resume. Held for ever, a few faults on a small cluster left a job
no node set could ever hold (a two-node job on a cluster with one node not excluded),
pending with nothing to wait for. A node that failed it again is excluded again, and
the launcher's restart limit bounds how often.
"""

from __future__ import annotations

from collections.abc import Mapping


def standing(
    excluded: tuple[str, ...], requeued_at: float | None, up_since: Mapping[str, float]
) -> tuple[str, ...]:
    """The nodes of `excluded` (recorded when the run was requeued at `requeued_at`)
    that have not come back UP since; `up_since`: each UP node's time of coming UP."""
    if requeued_at is None:
        return excluded
    return tuple(n for n in excluded if not (n in up_since and up_since[n] > requeued_at))
