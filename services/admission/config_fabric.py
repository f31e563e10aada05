"""Pure: a node set's `fabric` list in the cluster configuration — the links its nodes'
agents watch for faults (docs/health.md):

    [node_sets.gpu]
    nodes = "node[01-64]"
    fabric = ["mlx5_0", "mlx5_1/1", "ib0"]

Each entry is an InfiniBand/RoCE HCA (`mlx5_0`: every port), one port of it
(`mlx5_0/1`), or a network interface (`ib0`, `eth1`). Unset or empty, an agent watches
every HCA it finds. A node in several sets watches the links of all of them.
"""

from __future__ import annotations

import re

from . import config_read as r

# An HCA (IB_DEVICE_NAME_MAX 64) or a netdev (IFNAMSIZ 16), optionally /port.
_LINK = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}(/[1-9][0-9]{0,2})?")
EXAMPLE = 'e.g. fabric = ["mlx5_0", "mlx5_1/1", "ib0"]'


def fabric_links(value: object, key: str, p: r.Problems) -> tuple[str, ...]:
    """The links a `fabric = [...]` names; each bad one is a problem that says why."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        p.add(
            key, f"expected a list of HCA, HCA/port or interface names ({EXAMPLE}), got {value!r}"
        )
        return ()
    bad = [v for v in value if not _LINK.fullmatch(v)]
    for v in bad:
        p.add(
            key,
            f"{v!r} is not a link name: give an HCA (mlx5_0), one of its ports (mlx5_0/1) "
            f"or an interface (ib0), without spaces or commas",
        )
    return tuple(dict.fromkeys(v for v in value if v not in bad))
