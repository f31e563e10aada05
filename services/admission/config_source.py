"""Shell: the cluster configuration file admission validates against, reloadable.

`MUSTER_CLUSTER_CONFIG` names a TOML file (docs/configuration.md). At start a bad file
is fatal: admission must not accept jobs against a policy nobody wrote. Later, an
operator's `muster reload` or a change of the file's mtime re-reads it; a bad new file
is refused with every problem listed and the configuration in force stays.
Without a file, `config` is None and admission checks only the registered nodes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from shared.logs import kv

from .config import ConfigError, load_config
from .config_model import ClusterConfig

log = logging.getLogger(__name__)


class ConfigSource:
    def __init__(self, path: str) -> None:
        self.path = path
        self.config: ClusterConfig | None = None
        self.text = ""  # the text of the configuration in force (identities are read from it)
        self._stamp: tuple[int, int] | None = None
        if path:
            self.text = Path(path).read_text()
            self.config = load_config(self.text)
            self._stamp = self._mtime()

    def _mtime(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def reload(self) -> tuple[bool, str]:
        """Re-read the file; (changed, message). Raises ConfigError or OSError if the
        file is unreadable or invalid, leaving the configuration in force."""
        if not self.path:
            return False, "no configuration file (MUSTER_CLUSTER_CONFIG is not set)"
        stamp = self._mtime()
        text = Path(self.path).read_text()
        config = load_config(text)
        changed = config != self.config
        self.config, self._stamp, self.text = config, stamp, text
        log.info("configuration loaded", extra=kv(path=self.path, changed=changed))
        return changed, f"configuration {'reloaded' if changed else 'unchanged'}: {self.path}"

    def reload_if_changed(self) -> None:
        """For a periodic check: re-read when the file's mtime or size moved."""
        if not self.path or self._mtime() == self._stamp:
            return
        try:
            self.reload()
        except (ConfigError, OSError) as err:
            self._stamp = self._mtime()  # do not retry the same bad file every tick
            log.error("configuration change refused", extra=kv(path=self.path, error=str(err)))
