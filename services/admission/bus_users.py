"""Shell: the users' keys reach the bus. On a cluster whose authorization file admission
is given (`MUSTER_NATS_AUTH_DIR`, a local cluster's secrets folder: `muster up` and the
test clusters set it), every key registered or removed (`muster user add NAME --key`,
`muster user remove-key`, a key folder's `.pub` files) is rendered into that file's users'
entries and the NATS servers reload it (`shared.security.sync_bus_users`): a new key can
connect within seconds, a removed key's connection is closed and refused. On a real
cluster the bus's authorization is the operator's (docs/security.md): no folder, nothing
done here.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from shared.identity import Directory
from shared.logs import kv
from shared.security import sync_bus_users

log = logging.getLogger(__name__)


class BusUsers:
    def __init__(self, folder: str) -> None:
        self.folder = Path(folder) if folder else None
        self._synced: dict[str, str] | None = None  # the keys last rendered

    async def sync(self, directory: Directory) -> None:
        """Render `directory`'s keys into the authorization when they differ from what
        was last rendered (the first call always looks: a server may have started with
        fewer keys than the services honour)."""
        keys = dict(directory.users_by_key)
        if self.folder is None or keys == self._synced:
            return
        try:
            signalled = await asyncio.to_thread(sync_bus_users, self.folder, keys)
        except (OSError, ValueError) as err:  # tried again at the next check
            log.error("bus users not synced", extra=kv(folder=str(self.folder), error=str(err)))
            return
        self._synced = keys
        if signalled is not None:
            log.info("bus users synced", extra=kv(keys=len(keys), servers_reloaded=signalled))
