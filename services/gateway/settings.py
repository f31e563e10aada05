"""Plumbing: the gateway's settings and the one key it acts with.

The gateway serves one user, the one who runs it: it binds to 127.0.0.1 by default and
signs every request with that user's key, found as the CLI finds it (muster/client.py):
`MUSTER_KEY_FILE`, else `NAME.nk` in `MUSTER_KEY_DIR` or in the state folder's `keys/`,
else `~/.muster/user.nk`; NAME is `MUSTER_USER` or the login name. Anyone who can reach
its port acts as that user, which is why it listens on loopback unless told otherwise.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable

from shared.settings import GatewaySettings

__all__ = ["GatewaySettings", "acting_user", "key_path"]


def acting_user(settings: GatewaySettings) -> str:
    return settings.user or getpass.getuser()


def key_path(settings: GatewaySettings, exists: Callable[[str], bool] = os.path.exists) -> str:
    """The key file the gateway signs with (the order in the module docstring)."""
    if settings.key_file:
        return settings.key_file
    name = acting_user(settings)
    for folder in (settings.key_dir, os.path.join(settings.state_dir, "keys")):
        if folder and exists(candidate := os.path.join(folder, f"{name}.nk")):
            return candidate
    return os.path.join(os.path.expanduser("~"), ".muster", "user.nk")
